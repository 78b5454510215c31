"""What crosses the proxy's HTTP edge for one model call: the request headers it needs, its body (read within the
limit, parsed as a JSON object) and the reply types both servers write (``ProxyApp`` over ASGI, ``proxy._http``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import orjson

from ._errors import ProxyError

JSON = "application/json"
# Names the stored call on every answer to a call the proxy recorded (errors included); written in lower case, as
# HTTP/2 and ASGI require (header names are case-insensitive).
CALL_ID_HEADER = b"x-openforge-call-id"
Receive = Callable[[], Awaitable[dict]]


class ClientGone(Exception):
    """The client disconnected before its request body arrived: there is no one to answer."""


@dataclass(slots=True)
class CallHeaders:
    """The request headers a call needs (ASGI gives a list of lower-cased byte pairs; one pass picks these)."""

    token: str | None = None  # Authorization: Bearer ..., else x-api-key (x-goog-api-key: the Gemini API's)
    content_length: str | None = None
    # what tells a harness's own utility calls (``proxy._self_calls``): read, never stored
    self_call: str | None = None  # X-OpenForge-Self-Call
    codex_turn: str | None = None  # Codex CLI's x-codex-turn-metadata
    subagent: str | None = None  # Codex CLI's x-openai-subagent

    @classmethod
    def from_asgi(cls, raw: list[tuple[bytes, bytes]]) -> CallHeaders:
        h, api_key = cls(), None
        for name, value in raw:
            if name == b"authorization":
                if value[:7].lower() == b"bearer ":
                    h.token = value[7:].strip().decode("latin-1") or None
            elif name == b"x-api-key" or name == b"x-goog-api-key":
                api_key = value.decode("latin-1") or None
            elif name == b"content-length":
                h.content_length = value.decode("latin-1")
            elif name[:2] == b"x-":
                if name == b"x-openforge-self-call":
                    h.self_call = value.decode("latin-1")
                elif name == b"x-codex-turn-metadata":
                    h.codex_turn = value.decode("latin-1")
                elif name == b"x-openai-subagent":
                    h.subagent = value.decode("latin-1")
        h.token = h.token or api_key
        return h


@dataclass(slots=True)
class Reply:
    """A whole answer."""

    status: int
    body: bytes
    content_type: str = JSON
    call_id: str | None = None  # the stored call this answers (``CALL_ID_HEADER``); None: nothing was recorded


class Last(bytes):
    """A stream's final piece (the server may send it together with the end of the transfer)."""


@dataclass(slots=True)
class StreamReply:
    """An SSE answer: ``chunks`` yields the client's bytes; closing it early records what was sent so far."""

    chunks: AsyncIterator[bytes]
    status: int = 200
    content_type: str = "text/event-stream; charset=utf-8"
    abandon: Callable[[], None] | None = None  # frees what ``chunks`` holds if it is dropped before its first step
    call_id: str | None = None  # the stored call (``CALL_ID_HEADER``): assigned before the answer's first byte


def too_large(limit: int, declared: int | None = None) -> ProxyError:
    size = f"request body of {declared:,} bytes is" if declared is not None else "request body is"
    return ProxyError(413, f"{size} over the proxy's limit of {limit:,} bytes; raise OPENFORGE_PROXY_MAX_BODY_BYTES "
                           "if this is intended", code="body_too_large")


async def read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """The request body from ASGI ``receive``; 413 past ``limit`` bytes (declared or counted)."""
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large(limit, int(declared))
    body, more = b"", True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk, more = message.get("body", b""), message.get("more_body", False)
        if len(body) + len(chunk) > limit:
            raise too_large(limit)
        body = body + chunk if body else chunk
    return body


def parse_json(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProxyError(400, f"request body is not valid JSON ({exc}); send a JSON object",
                         code="invalid_json") from None
    if not isinstance(body, dict):
        raise ProxyError(400, f"request body is JSON {type(body).__name__}, not an object; send a JSON object",
                         code="invalid_json")
    return body
