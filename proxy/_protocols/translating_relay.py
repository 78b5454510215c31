"""``TranslatingRelay``: the base of the relays that turn upstream chat-completions chunks into another API's
events (Responses, Messages)."""

from __future__ import annotations

from .completion import loads_answer
from .errors import answer_guarded
from .sse import sse_data


class TranslatingRelay:
    """``feed`` handles what every such relay must: comments and other SSE fields yield nothing, ``[DONE]`` ends the
    stream, an upstream error event becomes the API's own failure (``_fail(ERROR_KIND, message)``); each chat chunk
    goes to ``_on_chunk``. A payload that is not JSON raises ``orjson.JSONDecodeError`` (the service records it).
    Subclasses set ``self.chat`` (the chat ``StreamState`` that assembles the record's answer)."""

    ERROR_KIND = "api_error"
    done = False
    error: tuple[str, str] | None = None

    @property
    def first_token(self) -> bool:
        return self.chat.first_token

    @answer_guarded
    def feed(self, event: bytes) -> bytes:
        data = sse_data(event)
        if data is None:
            return b""
        if data == b"[DONE]":
            self.done = True
            return b""
        chunk = loads_answer(data, True)  # the prompt's ids as text: the client never sees them
        if "error" in chunk and not chunk.get("choices"):
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            self.error = ("upstream_stream_error", data[:2000].decode(errors="replace"))
            return self._fail(self.ERROR_KIND, str(err.get("message")))
        return self._on_chunk(chunk)

    def _on_chunk(self, chunk: dict) -> bytes:
        raise NotImplementedError

    def _fail(self, kind: str, message: str) -> bytes:
        raise NotImplementedError
