"""One keep-alive HTTP/1.1 connection to the upstream, on an asyncio protocol, its answers parsed by httptools.

One answer at a time; the caller waits for what is new (headers, body, end, error) with ``wait`` and takes the body
with ``take``. A stream its caller read to the terminating event can be parked until the transfer's end arrives
(``park``), so that the connection goes back to the pool instead of being closed.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

import httptools

PARK_S = 1.0  # how long a finished stream's connection waits for the end of its transfer before it is closed
_HIGH_WATER = 4 << 20  # buffered answer bytes before the connection stops reading


class Gone(Exception):
    """The connection closed (or broke the protocol) before the answer was complete; ``started``: bytes came."""

    def __init__(self, cause: BaseException | None, started: bool):
        super().__init__(str(cause) if cause else "connection closed")
        self.cause, self.started = cause, started


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection; one answer at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.parser = httptools.HttpResponseParser(self)  # goes on to the next answer of a kept-alive connection
        self.chunks: collections.deque[bytes] = collections.deque()
        self.waiter: asyncio.Future | None = None
        self.parked: Callable[[UpstreamConnection], None] | None = None  # see park()
        self._park_timer: asyncio.TimerHandle | None = None
        self.reset()

    def reset(self) -> None:
        """Ready for the next answer (the previous one was taken whole)."""
        self.status = 0
        self.content_type = ""
        self.headers_done = self.done = self.started = self.framed = False
        self.keep_alive = True
        self.buffered = 0
        self.done_at = 0.0
        self.error: Gone | None = None
        self.paused = False
        self.whole = False  # the caller wants the answer whole: wake it when it is complete (or fails), not per piece

    # ---- asyncio protocol ----
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.started = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = Gone(exc, True)
            self.abort()
        if self.parked is not None:
            if self.done or self.error is not None:
                self._unpark()
            return
        if not self.whole or self.done or self.error is not None or self.paused:
            self._wake()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        if self.parked is not None:
            self._unpark()  # closed: the pool drops it
            return
        if not self.done and self.error is None:
            if self.headers_done and exc is None and not self.framed:  # a body delimited by the connection's end
                self.done, self.keep_alive = True, False
            else:
                self.error = Gone(exc, self.started)
        self._wake()

    # ---- httptools callbacks ----
    def on_header(self, name: bytes, value: bytes) -> None:
        n = len(name)
        if n == 12 and name.lower() == b"content-type":
            self.content_type = value.decode("latin-1").split(";", 1)[0].strip()
        elif (n == 14 and name.lower() == b"content-length") or (n == 17 and name.lower() == b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        if self.parked is not None:  # the caller is gone; the transfer's last bytes are not anyone's
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.done_at = time.perf_counter()
        self.done = True
        self.keep_alive = self.parser.should_keep_alive()

    # ---- the answer, for one caller ----
    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until something new arrives (headers, body, end, error); TimeoutError after ``timeout`` of silence."""
        self.waiter = waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    def park(self, checkin: Callable[[UpstreamConnection], None]) -> None:
        """The caller has what it wanted, but the transfer has not ended yet (a stream's terminating event came and
        the empty last chunk is still on its way, often in a packet of its own): ``checkin(self)`` once it ends,
        rather than closing a connection the server is about to leave reusable. Closed if it does not end within
        ``PARK_S``."""
        self.chunks.clear()
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        self.parked = checkin
        self._park_timer = self.loop.call_later(PARK_S, self.abort)

    def _unpark(self) -> None:
        checkin, self.parked = self.parked, None
        self._park_timer.cancel()
        checkin(self)

    def abort(self) -> None:
        """Close this connection for good (its answer is abandoned or broken)."""
        if not self.closed:
            self.closed = True
            self.transport.close()

    def take(self) -> bytes:
        out = b"".join(self.chunks) if len(self.chunks) != 1 else self.chunks[0]
        self.chunks.clear()
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        return out


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
