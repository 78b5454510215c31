"""``PassthroughRelay``: a native-mode stream (the upstream speaks the client's API itself) relayed unchanged.

Every upstream event goes on as it came except the terminal one, held back until the call is journaled
(invariant 1); the events are kept to build the record's answer when the stream ends.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from .._errors import UpstreamFailure
from .completion import Completion
from .sse import sse_data


class PassthroughRelay:
    """``terminal``: the event types that end the answer; ``failed``: those that report an error; ``complete(events)``
    builds the record's answer from the parsed events; ``failure(exc)`` renders a proxy-side failure (upstream
    dropped, timed out) as the protocol's error event."""

    def __init__(self, *, terminal: tuple[str, ...], failed: tuple[str, ...],
                 complete: Callable[[list[dict]], Completion], failure: Callable[[UpstreamFailure], bytes]):
        self.terminal, self.failed, self.complete, self.failure = terminal, failed, complete, failure
        self.done, self.error, self.first_token = False, None, False
        self.events: list[dict] = []
        self._held = b""

    def feed(self, event: bytes) -> bytes:
        data = sse_data(event)
        try:
            obj = orjson.loads(data) if data and data != b"[DONE]" else None
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            return event + b"\n\n"
        self.events.append(obj)
        kind = obj.get("type")
        self.first_token = self.first_token or kind in ("response.output_text.delta", "content_block_delta")
        if kind in self.failed:
            self.error = ("upstream_stream_error", data[:2000].decode(errors="replace"))
        if kind in self.terminal:
            self.done, self._held = True, event + b"\n\n"
            return b""
        return event + b"\n\n"

    def result(self) -> Completion:
        return self.complete(self.events)

    def end(self) -> bytes:
        return self._held
