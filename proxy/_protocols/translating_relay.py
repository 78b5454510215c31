"""``TranslatingRelay``: the base of the relays that turn upstream chat-completions chunks into another API's
events (Responses, Messages, Gemini)."""

from __future__ import annotations

from .._errors import UpstreamFailure
from .completion import Completion, loads_answer
from .errors import answer_guarded
from .sse import sse_data


class TranslatingRelay:
    """``feed`` handles what every such relay must: comments and other SSE fields yield nothing, ``[DONE]`` ends the
    stream, an upstream error event becomes the API's own failure (``_fail(ERROR_KIND, message)``); each chat chunk
    goes to ``_on_chunk``. A payload that is not JSON raises ``orjson.JSONDecodeError`` (the service records it).
    Subclasses set ``self.chat`` (the chat ``StreamState`` that assembles the record's answer) and set ``failed``
    in ``_fail``.

    The stream's end is the same skeleton everywhere (``end``): nothing more after a failure, the API's failure of
    kind ``TRUNCATED_KIND`` if the upstream never said ``[DONE]``, else the API's closing events from the whole
    answer (``_finish(completion)``)."""

    ERROR_KIND = "api_error"
    TRUNCATED_KIND = "upstream_stream_truncated"
    done = False
    failed = False
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

    def failure(self, exc: UpstreamFailure) -> bytes:
        return self._fail(exc.error_class, exc.message)

    def result(self) -> Completion:
        return self.chat.result()

    def end(self) -> bytes:
        if self.failed:
            return b""
        if not self.done:
            return self._fail(self.TRUNCATED_KIND, "the upstream stream ended before the answer was complete")
        return self._finish(self.chat.result())

    def _on_chunk(self, chunk: dict) -> bytes:
        raise NotImplementedError

    def _fail(self, kind: str, message: str) -> bytes:
        raise NotImplementedError

    def _finish(self, comp: Completion) -> bytes:
        raise NotImplementedError
