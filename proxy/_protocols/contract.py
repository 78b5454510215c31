"""The adapter protocol ``ProxyService`` speaks, and what the wire-protocol adapters share.

An adapter stands for one client API. Per call the service asks it to:

- ``validate(body)``: raise ``ProxyError`` (400) for a body that API would reject;
- ``translate(body, dialect, rollout_id) -> Translation``: the prompt to store (chat messages), the tools, the
  upstream request, and the adapter's own per-call context (``wants``), which it gets back below;
- ``parse(data) -> Completion``: the upstream's one-piece answer, protocol-neutral, for the record;
- ``answer(data, wants) -> dict``: what the client gets for that answer;
- ``relay(wants) -> Relay``: turns the upstream's stream into the client's, event by event;
- ``upstream_error(status, body, content_type) -> (body, content_type)``: an upstream HTTP error in the client's
  error shape;
- optionally ``ids_as_text(wants) -> bool``: True when ``answer`` never gives the client the prompt's token ids, so
  the service may hand them to ``parse`` as ``IdsText`` (cut from the answer as text, not parsed into ints).

``SURFACE`` is the API surface recorded on the call and ``PATH`` the upstream path posted to. The chat-shaped
modules (``openai_chat``, ``openai_completions``: validate / prepare / parse / strip / StreamState) speak the
protocol through ``ChatShaped``, which keeps their behaviour byte for byte.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import orjson

from .._errors import ProxyError, UpstreamFailure
from .._record import Completion, loads_answer


@dataclass
class Translation:
    """One request as the service needs it: what to store, what to send upstream, what the adapter keeps."""

    messages: list[dict]  # the prompt as chat messages (stored; images still inline, the service moves them)
    tools: list | None  # the tools as the upstream sees them
    upstream: dict  # the upstream request body
    wants: Any  # the adapter's per-call context, handed back to answer() and relay()
    params: dict  # everything else the client sent (model, sampling, unknown fields): nothing is dropped
    stream: bool
    notes: dict = field(default_factory=dict)  # what could not be forwarded, for the record's metadata


class Relay(Protocol):
    """One streamed answer, upstream SSE events in, client bytes out.

    ``done``: the upstream said the answer is complete; ``error``: (error class, detail) once the upstream reported
    an error. ``end()`` is sent only after the call is journaled (invariant 1): it holds the client's terminal event.
    """

    done: bool
    error: tuple[str, str] | None
    first_token: bool

    def feed(self, event: bytes) -> bytes: ...
    def failure(self, exc: UpstreamFailure) -> bytes: ...
    def result(self) -> Completion: ...
    def end(self) -> bytes: ...


def sse_data(event: bytes) -> bytes | None:
    """The data payload of one SSE event (joined if it spans lines); None for comments and other fields."""
    if event.startswith(b"data:") and b"\n" not in event:
        return event[5:].strip()
    lines = [ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


class TranslatingRelay:
    """Base of the relays that turn upstream chat-completions chunks into another API's events.

    ``feed`` handles what every such relay must: comments and other SSE fields yield nothing, ``[DONE]`` ends the
    stream, an upstream error event becomes the API's own failure (``_fail(ERROR_KIND, message)``); each chat chunk
    goes to ``_on_chunk``. A payload that is not JSON raises ``orjson.JSONDecodeError`` (the service records it).
    """

    ERROR_KIND = "api_error"
    done = False
    error: tuple[str, str] | None = None

    @property
    def first_token(self) -> bool:
        return self.chat.first_token

    def feed(self, event: bytes) -> bytes:
        data = sse_data(event)
        if data is None:
            return b""
        if data == b"[DONE]":
            self.done = True
            return b""
        chunk = loads_answer(data, True)  # the chunk that carries the prompt's ids: as text (the client never sees them)
        if "error" in chunk and not chunk.get("choices"):
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            self.error = ("upstream_stream_error", data[:2000].decode(errors="replace"))
            return self._fail(self.ERROR_KIND, str(err.get("message")))
        return self._on_chunk(chunk)

    def _on_chunk(self, chunk: dict) -> bytes:
        raise NotImplementedError

    def _fail(self, kind: str, message: str) -> bytes:
        raise NotImplementedError


def sse_event(name: str, data: dict) -> bytes:
    """One named SSE event, as the Responses and Messages APIs send them."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class ChatRelay:
    """A chat-shaped stream: each upstream chunk goes on as it came (less what the proxy added), ``[DONE]`` last."""

    def __init__(self, state):
        self.state, self.done, self.error = state, False, None

    @property
    def first_token(self) -> bool:
        return self.state.first_token

    def feed(self, event: bytes) -> bytes:
        data = sse_data(event)
        if data is None:
            return event + b"\n\n"
        if data == b"[DONE]":
            self.done = True
            return b""
        chunk = loads_answer(data, not self.state.wants.token_ids)
        if "error" in chunk and not chunk.get("choices"):
            self.error = ("upstream_stream_error", data[:2000].decode(errors="replace"))
            return event + b"\n\n"
        out = self.state.feed(chunk)
        if out is None:
            return b""
        return b"data: " + (data if out is chunk and self.state.wants.everything else orjson.dumps(out)) + b"\n\n"

    def failure(self, exc: UpstreamFailure) -> bytes:
        return b"data: " + orjson.dumps(exc.openai_body()) + b"\n\n"

    def result(self) -> Completion:
        return self.state.result()

    def end(self) -> bytes:
        return b"data: [DONE]\n\n" if self.done else b""


_PROMPT_KEYS = ("messages", "tools", "prompt")


class ChatShaped:
    """The adapter protocol over a chat-shaped module (the client's API is the upstream's)."""

    def __init__(self, module: ModuleType):
        self.module, self.SURFACE, self.PATH = module, module.SURFACE, module.PATH
        self.validate, self.parse = module.validate, module.parse

    def translate(self, body: dict, dialect: str, rollout_id: str | None) -> Translation:
        m = self.module
        messages = m.messages(body) if hasattr(m, "messages") else body["messages"]
        up, wants = m.prepare(body, dialect)
        params = {k: v for k, v in body.items() if k not in _PROMPT_KEYS}
        return Translation(messages, body.get("tools"), up, wants, params, bool(body.get("stream")))

    def answer(self, data: dict, wants) -> dict:
        return self.module.strip(data, wants)

    @staticmethod
    def ids_as_text(wants) -> bool:
        return not wants.token_ids  # a client that asked for the ids gets them as the upstream sent them

    def relay(self, wants) -> ChatRelay:
        return ChatRelay(self.module.StreamState(wants))

    @staticmethod
    def upstream_error(status: int, body: bytes, content_type: str | None) -> tuple[bytes, str | None]:
        return body, content_type


def as_adapter(adapter):
    """``adapter`` itself if it speaks the protocol, else a chat-shaped module wrapped in ``ChatShaped``."""
    return adapter if hasattr(adapter, "translate") else ChatShaped(adapter)


def chat_tool_call(call_id: str, name: str, arguments: str) -> dict:
    """One tool call as a chat assistant message carries it."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def guarded(translate):
    """A translation reads only the client's body: a shape it did not expect is the client's 400, never a 500."""

    @functools.wraps(translate)
    def wrapper(self, body: dict, *args):
        try:
            return translate(self, body, *args)
        except (TypeError, AttributeError, KeyError, ValueError, IndexError) as exc:
            raise bad_request(f"the request could not be translated for a chat-completions upstream "
                              f"({exc.__class__.__name__}: {exc}); check the body against the API reference",
                              code="untranslatable_request") from exc

    return wrapper


def bad_request(message: str, param: str | None = None, code: str = "invalid_request") -> ProxyError:
    return ProxyError(400, message, param=param, code=code)


def upstream_message(body: bytes) -> str:
    """The human message inside an upstream error body (OpenAI or Anthropic shaped), else the body's text."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:2000].decode(errors="replace")
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return data["message"]
    return body[:2000].decode(errors="replace")

