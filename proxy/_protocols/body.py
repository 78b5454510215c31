"""What every protocol's request body must be for the proxy to forward it and record it exactly, checked before
anything goes upstream; and what an image ``data:`` URL must hold.

The body comes parsed by orjson (``proxy._exchange.parse_json``), which already refuses, as the 400
``invalid_json``: invalid UTF-8, lone surrogates, NaN and Infinity, numbers past a double, and a top level that is
not an object. Two things it lets through would break later, so ``check_body`` refuses them (400):

- nesting past ``MAX_DEPTH`` levels (``too_deep``): orjson reads 1,024 levels but writes only 254, and every copy
  the proxy makes is written by it (the upstream request, one level deeper where tools are translated; the stored
  messages, tools and parameters). No harness nests past ~20 (tool JSON schemas); 128 leaves the copies room.
- integers outside -2^63..2^64-1 (``integer_out_of_range``): orjson reads them as floats, so 2^64 would go
  upstream as 1.8446744073709552e+19 and the store (canonical JSON, msgpack journal) keeps nothing wider either.
  Refused, not forwarded changed. A float that large with no fraction (1e19) is refused too: once parsed the two
  cannot be told apart, and no API field takes such a number; send it as a string.

Cost: one ``orjson.dumps`` of the body (about 20 us for Claude Code's 85 KB request), plus a walk of the body
only when that output holds a float of 1e16 or more (orjson writes only those with ``e+``). The depth is checked in
that same dump, with the body put at the bottom of ``_WRITE_DEPTH - MAX_DEPTH`` nested lists; those lists are built
once per thread (``_Nest``), not per call: building them was most of the check on ``bench/proxy_overhead.py``'s
8 KB body (7-8 us with them built per call, 3 us now).
"""

from __future__ import annotations

import threading

import orjson

from .errors import bad_request

MAX_DEPTH = 128
NOT_AN_IMAGE = "unsupported_media_type"  # the code of a data URL or image source that holds no image
_WRITE_DEPTH = 254  # orjson.dumps refuses deeper values ("Recursion limit reached")
_BIG = 2.0 ** 63  # a float this large that is a whole number may have been an integer orjson could not keep
_PLUS, _E = ord("+"), ord("e")


class _Nest(threading.local):
    """``_WRITE_DEPTH - MAX_DEPTH`` nested lists, one thread's: ``dumps(body)`` writes ``body`` at the bottom, so
    that orjson's own limit refuses a body deeper than ``MAX_DEPTH``. Per thread because the bottom is filled per
    call (a proxy in each of several threads, as tests run them, must not see another's body)."""

    def __init__(self):
        self.bottom: list = [None]
        self.top = self.bottom
        for _ in range(_WRITE_DEPTH - MAX_DEPTH - 1):
            self.top = [self.top]

    def dumps(self, body: dict) -> bytes:
        self.bottom[0] = body
        try:
            return orjson.dumps(self.top)
        finally:
            self.bottom[0] = None


_nest = _Nest()


def check_body(body: dict) -> None:
    """400 for a body the proxy could not forward and record exactly (see the module docstring)."""
    try:
        out = _nest.dumps(body)  # body deeper than MAX_DEPTH <=> the nested value past orjson's limit
    except orjson.JSONEncodeError:
        raise bad_request(f"the request body nests arrays and objects more than {MAX_DEPTH} levels deep; the proxy "
                          "cannot forward and record it exactly: flatten it (no API takes such nesting)",
                          code="too_deep") from None
    if _holds_large_float(out):
        where = _large_integral(body, "")
        if where is not None:
            path, value = where
            raise bad_request(f"the number {value!r} at {path or 'the top level'} is an integer outside "
                              "-2^63..2^64-1 (or a float that large with no fraction), which the proxy cannot "
                              "forward and record exactly; send it as a string, or a smaller number",
                              path.split(".")[0] or None, "integer_out_of_range")


def _holds_large_float(out: bytes) -> bool:
    """Whether orjson's output may hold a float of 1e16 or more (a digit, ``e+``): one memchr per ``+``."""
    i = out.find(_PLUS)
    while i != -1:
        if i >= 2 and out[i - 1] == _E and 48 <= out[i - 2] <= 57:
            return True
        i = out.find(_PLUS, i + 1)
    return False


def _large_integral(node, path: str) -> tuple[str, float] | None:
    """(dotted path, value) of the first whole-number float of magnitude 2^63 or more under ``node``."""
    if isinstance(node, float):
        return (path, node) if abs(node) >= _BIG and node.is_integer() else None
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if isinstance(value, (float, dict, list)):
            found = _large_integral(value, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    return None


def check_image_url(url: str, where: str, param: str) -> None:
    """An image part's ``data:`` URL must hold an image, base64-encoded (the store keeps it as an image blob; the
    upstream decodes it as one). Other URLs go on as they are."""
    if not url.startswith("data:"):
        return
    head, comma, _ = url.partition(",")
    media_type = head[5:].split(";", 1)[0].strip().lower()
    if not media_type.startswith("image/"):
        named = repr(media_type) if media_type else "none (text/plain, RFC 2397)"
        raise bad_request(f"{where}: an image data URL of media type {named} is not an image; send image/png, "
                          "image/jpeg, image/gif or image/webp (other files are not forwarded as images)", param,
                          NOT_AN_IMAGE)
    if not comma or not head.lower().endswith(";base64"):
        raise bad_request(f"{where}: the image data URL is not base64; send data:{media_type};base64,<data>", param,
                          "invalid_image")


def check_image_media_type(media_type, where: str, param: str) -> None:
    """An Anthropic base64 image source's ``media_type`` must name an image."""
    if not isinstance(media_type, str) or not media_type.strip().lower().startswith("image/"):
        raise bad_request(f"{where}: an image source of media type {media_type!r} is not an image; send image/png, "
                          "image/jpeg, image/gif or image/webp", param, NOT_AN_IMAGE)
