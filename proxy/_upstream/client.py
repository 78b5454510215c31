"""The one upstream client (``Upstream``): HTTP/1.1 keep-alive connections on asyncio protocols, parsed by httptools.

The proxy forwards bodies it has already serialized and reads answers whole or as SSE, one origin, many concurrent
calls: a general-purpose client's per-request machinery (URL objects, header multidicts, cookie jars, tracing,
timers per phase) was the largest single cost of a proxied call after the proxy's own work. This client writes
one pre-built request head and lets httptools (the C parser uvicorn uses) call back per header and body chunk.
``bench/upstream_clients.py``, CPU per request on the 2-core machine (JSON / stream): at 64 concurrent 0.072 /
0.174 ms against aiohttp's 0.155 / 0.271 (httpx: 8.4 / 9.3, its pool collapses there); at 1 client 0.35 / 0.61
against 0.65 / 0.90.

Connection failures become 502 and silences past the read timeout 504 (for an answer read whole: no complete answer
within it), both recorded as infrastructure errors; the upstream's own HTTP errors pass through unchanged. A pooled
connection that turns out closed before any byte of the answer came back is retried once on a fresh one; idle
connections are dropped before uvicorn's 5 s keep-alive (vLLM's and SGLang's server) would close them. A stream its
caller read to the terminating event goes back to the pool even if the transfer's end (the empty last chunk) is
still on its way: it is waited for there, not closed (closing them cost 100 new connections in 1,584 streamed calls
at 16 clients with ``bench/proxy_overhead.py``'s load). http and https (for hosted APIs) are both served.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from .._errors import UpstreamFailure
from .connection import Gone, UpstreamConnection

_KEEPALIVE_S = 3.0


@dataclass
class UpstreamAnswer:
    status: int
    content_type: str
    body: bytes
    waited_s: float = 0.0  # from the request's last write to the answer's last byte: the upstream's share of a call


class Upstream:
    def __init__(self, base_url: str, *, api_key: str | None = None, connect_timeout_s: float = 5.0,
                 read_timeout_s: float = 600.0, pool: int = 1024):
        base = base_url.rstrip("/")
        self.base_url = base[:-3] if base.endswith("/v1") else base
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream URL {base_url!r} is not an http(s) URL; use e.g. http://127.0.0.1:8000")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/")
        default_port = self._port == (443 if self._ssl else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        head = f"Host: {host if default_port else f'{host}:{self._port}'}\r\nUser-Agent: openforge-proxy\r\n"
        head += "Content-Type: application/json\r\nAccept-Encoding: identity\r\n"
        if api_key:
            head += f"Authorization: Bearer {api_key}\r\n"
        self._head = head
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self._idle: list[UpstreamConnection] = []
        self._parked: set[UpstreamConnection] = set()  # finished streams, transfer not ended (see _checkin)
        self._slots: asyncio.Semaphore | None = None
        self._pool = pool
        self.outstanding = 0  # requests sent and not yet finished: what least-outstanding routing compares
        self.closed = False  # removed from the proxy's pool: connections that come back are closed, not kept

    async def start(self) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._pool)

    async def close(self) -> None:
        self.closed = True
        for conn in [*self._idle, *self._parked]:
            conn.abort()
        self._idle.clear()
        self._parked.clear()

    def _fail(self, exc: BaseException, path: str) -> UpstreamFailure:
        if isinstance(exc, TimeoutError):
            return UpstreamFailure(504, f"upstream {self.base_url}{path} did not answer within the read timeout; "
                                        "the inference server is overloaded or stuck", "upstream_timeout")
        if isinstance(exc, Gone) and exc.cause is None:
            return UpstreamFailure(502, f"upstream {self.base_url}{path} closed the connection before its answer was "
                                        "complete; check the inference server's log", "upstream_unreachable")
        if isinstance(exc, Gone):
            exc = exc.cause
        return UpstreamFailure(502, f"upstream {self.base_url}{path} unreachable ({exc.__class__.__name__}: {exc}); "
                                    "check that the inference server is running", "upstream_unreachable")

    async def _connect(self, path: str) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: UpstreamConnection(loop), self._host, self._port, ssl=self._ssl,
                                       server_hostname=self._host if self._ssl else None),
                self.connect_timeout_s)
        except OSError as exc:  # TimeoutError and ssl.SSLError among them
            raise self._fail(exc if not isinstance(exc, TimeoutError) else
                             ConnectionError(f"no connection within {self.connect_timeout_s}s"), path) from exc
        return conn

    def _checkout(self) -> UpstreamConnection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < _KEEPALIVE_S:
                return conn
            conn.abort()
        return None

    def _checkin(self, conn: UpstreamConnection, complete: bool = False) -> None:
        """Back to the pool if its answer was taken whole and the server keeps it alive; ``complete``: the caller
        has all of the answer it wanted, so a transfer that has not quite ended is waited for (``park``) instead of
        closed. Anything else is closed (a server stops generating when its client goes)."""
        if self.closed:
            conn.abort()
        elif conn.done and conn.keep_alive and conn.error is None and not conn.closed and not conn.chunks:
            conn.idle_since = time.monotonic()
            conn.reset()
            self._idle.append(conn)
        elif complete and not conn.done and conn.error is None and not conn.closed and conn.keep_alive:
            self._parked.add(conn)
            conn.park(self._unparked)
        else:
            conn.abort()

    async def send(self, method: str, path: str, body: bytes | None = None) -> Pending:
        """Write the request and return at once (connecting first if no pooled connection is free); the answer is
        awaited through the returned ``Pending``, so the caller can work while the upstream does."""
        await self.start()
        await self._slots.acquire()
        self.outstanding += 1
        try:
            head = f"{method} {self._prefix}{path} HTTP/1.1\r\n{self._head}"
            head += f"Content-Length: {len(body)}\r\n\r\n" if body is not None else "\r\n"
            pending = Pending(self, path, head.encode() + body if body is not None else head.encode())
            await pending._write()
            return pending
        except BaseException:
            self.outstanding -= 1
            self._slots.release()
            raise

    async def _body(self, conn: UpstreamConnection, path: str) -> AsyncIterator[bytes]:
        """The answer's body as it arrives (what came since the last step, joined); UpstreamFailure if it breaks
        off or goes silent past the read timeout."""
        try:
            while True:
                if conn.chunks:
                    yield conn.take()
                elif conn.done:
                    return
                elif conn.error is not None:
                    raise conn.error
                else:
                    await conn.wait(self.read_timeout_s)
        except (Gone, TimeoutError) as exc:
            conn.abort()
            raise self._fail(exc, path) from None

    async def _read_rest(self, conn: UpstreamConnection, path: str) -> bytes:
        if conn.done and conn.error is None:  # the whole answer came with its head (the usual case): no generator
            return conn.take() if conn.chunks else b""
        parts = [data async for data in self._body(conn, path)]
        return b"".join(parts) if len(parts) != 1 else parts[0]

    def _unparked(self, conn: UpstreamConnection) -> None:
        self._parked.discard(conn)
        self._checkin(conn)

    def _finish(self, conn: UpstreamConnection, complete: bool = False) -> None:
        self._checkin(conn, complete)
        self.outstanding -= 1
        self._slots.release()

    async def request(self, method: str, path: str, body: bytes | None = None) -> UpstreamAnswer:
        return await (await self.send(method, path, body)).answer()

    async def open_stream(self, path: str, body: bytes) -> UpstreamStream:
        return await (await self.send("POST", path, body)).stream()


class Pending:
    """A request on the wire: ``answer()`` reads the whole answer, ``stream()`` its head (then iterate events).
    Exactly one of them must be awaited: it gives the connection back."""

    def __init__(self, upstream: Upstream, path: str, data: bytes):
        self._upstream, self._path, self._data = upstream, path, data
        self._conn: UpstreamConnection | None = None
        self._reused = False
        self.sent_at = 0.0

    async def _write(self) -> None:
        up = self._upstream
        conn = up._checkout()
        self._reused = conn is not None
        if conn is None:
            conn = await up._connect(self._path)
        self._conn = conn
        conn.transport.write(self._data)
        self.sent_at = time.perf_counter()

    async def _head(self, whole: bool = False) -> UpstreamConnection:
        """Wait for the answer's head (``whole``: for the whole answer, without a wake-up per piece); once more on a
        new connection if a pooled one was found closed."""
        up = self._upstream
        try:
            for attempt in (1, 2):
                conn = self._conn
                conn.whole = whole
                try:
                    while not conn.headers_done:
                        if conn.error is not None:
                            raise conn.error
                        await conn.wait(up.read_timeout_s)
                    return conn
                except (Gone, TimeoutError) as exc:
                    conn.abort()
                    if attempt == 1 and self._reused and isinstance(exc, Gone) and not exc.started:
                        await self._write()  # a keep-alive connection the server had closed
                        continue
                    raise up._fail(exc, self._path) from None
            raise AssertionError("unreachable")
        except BaseException:
            up._finish(self._conn)
            raise

    async def answer(self) -> UpstreamAnswer:
        conn = await self._head(whole=True)
        try:
            body = await self._upstream._read_rest(conn, self._path)
            return UpstreamAnswer(conn.status, conn.content_type, body, conn.done_at - self.sent_at)
        finally:
            self._upstream._finish(conn)

    async def stream(self) -> UpstreamStream:
        return UpstreamStream(self._upstream, await self._head(), self._path)

    def cancel(self) -> None:
        """Give up on the answer (the caller failed before awaiting it): the connection is closed."""
        if self._conn is not None:
            self._conn.abort()
            self._upstream._finish(self._conn)
            self._conn = None


class UpstreamStream:
    """An open streaming answer; iterate SSE events (the bytes between blank lines), then ``close()``."""

    def __init__(self, upstream: Upstream, conn: UpstreamConnection, path: str):
        self._upstream, self._conn, self._path = upstream, conn, path
        self.status = conn.status
        self.content_type = conn.content_type
        self._open = True

    async def read_all(self) -> bytes:
        try:
            return await self._upstream._read_rest(self._conn, self._path)
        finally:
            self.close()

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """SSE events as they arrive, in lists of those that arrived together (nothing is held back for a later
        one: a token the engine sent is relayed at once). UpstreamFailure if the upstream dies."""
        buf = b""
        async for data in self._upstream._body(self._conn, self._path):
            buf = buf + data if buf else data
            events, start = [], 0
            while True:
                cut = buf.find(b"\n\n", start)
                if cut < 0:
                    break
                if cut > start and buf[start:cut].strip():
                    events.append(buf[start:cut])
                start = cut + 2
            buf = buf[start:]
            if events:
                yield events
        if buf.strip():
            yield [buf]

    def close(self, complete: bool = False) -> None:
        """Give the connection back (answer complete) or close it (the caller stopped early: the upstream aborts).
        ``complete``: the caller stopped at the stream's terminating event, so it did not stop early; the end of
        the transfer, if still to come, is waited for in the pool's stead."""
        if self._open:
            self._open = False
            self._upstream._finish(self._conn, complete)
