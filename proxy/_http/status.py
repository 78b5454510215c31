"""HTTP/1.1 status lines, as both the model-call path and the ASGI bridge write them."""

from __future__ import annotations

import http

_PHRASES = {s.value: s.phrase.encode() for s in http.HTTPStatus}


def status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, _PHRASES.get(status, b""))
