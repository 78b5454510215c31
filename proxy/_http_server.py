"""The proxy's own HTTP/1.1 server: model calls straight to ``ProxyApp.answer``, everything else through ASGI.

A proxied call crosses this server twice (request in, answer out), and in ``bench/proxy_overhead.py`` the
general-purpose ASGI server under it (uvicorn: a scope dict, a request-response cycle object and an event per
request, header validation and an ASGI message per send) was the largest cost left on a call's path after the
proxy's own work. Here httptools parses, the body is read whole (held to the body limit while it arrives), and a
model call's reply goes out in one write, a stream's events as chunks as they come. Every other route (health,
metrics, models, token counting, the admin API, websocket handshakes) is served by the FastAPI app through a
small ASGI bridge, so its behaviour does not depend on which server runs it; ``ProxyApp`` stays a plain ASGI app
that any ASGI server can serve.

One connection: requests are parsed as bytes arrive and queued; one task per busy connection answers them in
order (pipelined requests included). A client that disconnects mid-stream cancels the relay, which records what
was sent. Writes wait while the client's socket buffer is full. Idle keep-alive connections close after
``keepalive_s``; ``stop()`` stops accepting, closes idle connections, lets calls in flight finish for up to
``graceful_s`` and then cuts them (their relays record what was sent).
"""

from __future__ import annotations

import asyncio
import collections
import http
import logging
import socket
import threading
import urllib.parse
from collections.abc import Callable

import httptools

from ._asgi_app import ProxyApp, error_reply
from ._errors import ProxyError
from ._service import CallHeaders, Last, Reply, StreamReply, too_large

log = logging.getLogger("proxy")

_MAX_HEAD = 64 << 10  # request line and headers; past it: 431
_PHRASES = {s.value: s.phrase.encode() for s in http.HTTPStatus}


def _status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, _PHRASES.get(status, b""))


class _Request:
    __slots__ = ("method", "url", "headers", "chunks", "size", "body", "keep_alive", "http_version", "upgrade",
                 "error", "head", "target")

    def __init__(self) -> None:
        self.method, self.url, self.headers, self.chunks, self.size = "", b"", [], [], 0
        self.body, self.keep_alive, self.http_version, self.upgrade = b"", True, "1.1", False
        self.error: ProxyError | None = None
        self.head = 0  # bytes of request line and headers so far
        self.target: tuple | None = None  # (parsed URL, path, model-call route or None), once parsed


class _Connection(asyncio.Protocol):
    def __init__(self, front: HttpServer):
        self.front, self.app = front, front.app
        self.loop = front.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: collections.deque[_Request] = collections.deque()
        self.cur: _Request | None = None
        self.worker: asyncio.Task | None = None
        self.relaying = False  # the worker relays a stream: a disconnect cancels it
        self.gone = False
        self.stop_reading = False  # after an upgrade, an error or a body past the limit: nothing more is parsed
        self.idle: asyncio.TimerHandle | None = None
        self.lost = front.loop.create_future()  # resolves when the client disconnects (ASGI http.disconnect)
        self._writable: asyncio.Future | None = None

    # ---- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.front.connections.add(self)
        self._arm_idle()

    def connection_lost(self, exc) -> None:
        self.gone = True
        self.front.connections.discard(self)
        if self.idle is not None:
            self.idle.cancel()
        if not self.lost.done():
            self.lost.set_result(None)
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        if self.relaying and self.worker is not None:
            self.worker.cancel()

    def pause_writing(self) -> None:
        self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def data_received(self, data: bytes) -> None:
        if self.stop_reading:
            return
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # the upgrade request is complete; the connection ends after its answer
            self.stop_reading = True
        except httptools.HttpParserCallbackError:
            raise
        except httptools.HttpParserError as exc:
            self.stop_reading = True
            req = self.cur or _Request()  # httptools began a message at the first bad byte: cur is that one
            req.error, req.keep_alive = ProxyError(400, f"malformed HTTP request ({exc}); send HTTP/1.1",
                                                   code="bad_http"), False
            self._enqueue(req)

    # ---- httptools callbacks --------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.cur = _Request()

    def on_url(self, url: bytes) -> None:
        self.cur.url += url
        self.cur.head += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        cur = self.cur
        cur.headers.append((name.lower(), value))
        cur.head += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        cur, parser = self.cur, self.parser
        cur.method = parser.get_method().decode("ascii")
        cur.http_version = parser.get_http_version()
        cur.keep_alive = parser.should_keep_alive()
        cur.upgrade = parser.should_upgrade()
        if cur.head > _MAX_HEAD:
            cur.error = ProxyError(431, f"request line and headers of {cur.head:,} bytes are over the proxy's limit "
                                        f"of {_MAX_HEAD:,}; send fewer or shorter headers", code="headers_too_large")
        expect = False
        for name, value in cur.headers:
            if name == b"content-length" and value.isdigit() and int(value) > self.front.max_body:
                cur.error = too_large(self.front.max_body, int(value))
            elif name == b"expect" and value.lower() == b"100-continue":
                expect = True
        if cur.error is not None:  # answered without reading the body, and the connection closes after
            cur.keep_alive, self.stop_reading = False, True
            self._enqueue(cur)
        elif expect and not self.queue and self.worker is None:  # only when this request is next to be answered
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        cur = self.cur
        if cur.error is not None:
            return
        cur.size += len(body)
        if cur.size > self.front.max_body:
            cur.error, cur.chunks = too_large(self.front.max_body), []
            cur.keep_alive, self.stop_reading = False, True
            self._enqueue(cur)
            return
        cur.chunks.append(body)

    def on_message_complete(self) -> None:
        cur = self.cur
        if cur.error is not None:
            return
        cur.body = cur.chunks[0] if len(cur.chunks) == 1 else b"".join(cur.chunks)
        cur.chunks = None
        if cur.upgrade:
            cur.keep_alive = False
        self._enqueue(cur)

    # ---- answering ----------------------------------------------------------------------------------------------
    def _enqueue(self, req: _Request) -> None:
        self.queue.append(req)
        if self.worker is None:
            if self.idle is not None:  # a request of the same read: the connection is busy again
                self.idle.cancel()
                self.idle = None
            if req.error is not None or req.method != "POST" or not self._model_call(req):
                self.worker = self.loop.create_task(self._serve())
                return
            self.worker = _STARTING  # requests parsed while it starts queue behind it
            task = _start_eagerly(self.loop, self._serve())
            if self.worker is _STARTING:  # still at work (it sets None itself when it ends before its first wait)
                self.worker = task

    def _model_call(self, req: _Request) -> bool:
        try:
            return self._target(req)[2] is not None
        except httptools.HttpParserInvalidURLError:
            return False

    def _target(self, req: _Request) -> tuple:
        """``req``'s parsed URL, its path, and its route if it is a model call (else None); parsed once."""
        if req.target is None:
            url = httptools.parse_url(req.url)
            path = url.path.decode("latin-1")
            if "%" in path:
                path = urllib.parse.unquote(path)
            req.target = url, path, self.app.route(path) if req.method == "POST" and not req.upgrade else None
        return req.target

    async def _serve(self) -> None:
        try:
            while self.queue and not self.gone:
                req = self.queue.popleft()
                if req.error is not None:
                    self._refuse(req)  # it closes the connection when the client has read the answer
                    return
                await self._dispatch(req)
                if not req.keep_alive or self.front.stopping:
                    self.transport.close()
                    return
        except Exception:
            log.exception("the proxy's HTTP server failed on a connection")
            self.transport.close()
        finally:
            self.worker = None
            self.relaying = False
        if not (self.gone or self.stop_reading or self.transport.is_closing()):  # stopped reading: closing anyway
            self._arm_idle()

    async def _dispatch(self, req: _Request) -> None:
        url, path, hit = self._target(req)
        if hit is not None:
            adapter, api_path, token = hit
            reply = await self.app.answer(adapter, api_path, token, CallHeaders.from_asgi(req.headers), None, req.body)
            if reply is None or self.gone:
                if isinstance(reply, StreamReply) and reply.abandon is not None:
                    reply.abandon()
                return
            if isinstance(reply, StreamReply):
                await self._relay(reply, req.keep_alive)
            else:
                self._write_reply(reply, req.keep_alive)
            return
        await _AsgiExchange(self, req, url, path).run()

    def _refuse(self, req: _Request) -> None:
        """Answer a request that was not read (malformed, head or body too large), then close. The client may still
        be sending: half-close and keep discarding what comes, so that the kernel does not reset the connection
        (and lose the answer) before the client has read it."""
        try:
            path = httptools.parse_url(req.url).path.decode("latin-1")
        except httptools.HttpParserInvalidURLError:
            path = "/"
        self._write_reply(error_reply(req.error, path, self.app.service.metrics), False)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(2.0, self.transport.close)

    def _write_reply(self, reply: Reply, keep_alive: bool) -> None:
        head = b"%scontent-type: %s\r\ncontent-length: %d\r\n%s\r\n" % (
            _status_line(reply.status), reply.content_type.encode(), len(reply.body),
            b"" if keep_alive else b"connection: close\r\n")
        self.transport.write(head + reply.body)

    async def _relay(self, reply: StreamReply, keep_alive: bool) -> None:
        """Chunked transfer of ``reply``; the relay is cancelled if the client leaves (it records what was sent).

        The head leaves with the first events, not on its own: one write (and one wake-up of the client) fewer per
        stream. A client waits for the first event either way; its read timeout runs the same."""
        chunks = reply.chunks
        self.relaying = True
        head = b"%scontent-type: %s\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n%s\r\n" % (
            _status_line(reply.status), reply.content_type.encode(), b"" if keep_alive else b"connection: close\r\n")
        try:
            ended = False
            async for chunk in chunks:
                data = b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunk else b""
                if type(chunk) is Last:  # the stream's final piece and the transfer's end: one write
                    data, ended = data + b"0\r\n\r\n", True
                if head:
                    data, head = head + data, b""
                if data:
                    self.transport.write(data)
                await self.drain()
                if self.gone:
                    break
            if not self.gone and not ended:
                self.transport.write(head + b"0\r\n\r\n")
        except asyncio.CancelledError:
            if not self.gone:
                raise
            asyncio.current_task().uncancel()
        finally:
            self.relaying = False
            await chunks.aclose()
            if reply.abandon is not None:  # a relay that never started cannot clean up after itself
                reply.abandon()

    async def drain(self) -> None:
        if self._writable is not None:
            await self._writable

    def _arm_idle(self) -> None:
        if self.front.stopping:
            self.transport.close()
            return
        if self.idle is not None:
            self.idle.cancel()
        self.idle = self.loop.call_later(self.front.keepalive_s, self.transport.close)

    def shutdown(self) -> None:
        """Server stopping: an idle connection closes now, a busy one after its current answer."""
        if self.worker is None:
            self.transport.close()


_STARTING = object()  # ``_Connection.worker`` while the worker runs its first step


def _start_eagerly(loop: asyncio.AbstractEventLoop, coro) -> asyncio.Task | None:
    """Run ``coro`` at once, in the caller's step, up to its first real wait; the rest runs as a task (None if it
    finished without waiting). What Python 3.12's eager task factory does, for 3.11.

    A model call is parsed, translated and written to the upstream before this returns: the upstream starts on it
    one event-loop turn earlier than through ``create_task`` (whose first step waits for the loop's next turn, ~50
    us at one client on the 2-core bench machine, every microsecond of it on the call's critical path). Until its
    first wait the coroutine runs without a current task: only model calls start so (the proxy's own code asks for
    none before a call's first wait); the FastAPI routes, whose libraries may ask, start as tasks."""
    try:
        first = coro.send(None)
    except StopIteration:
        return None
    return loop.create_task(_resume(coro, first))


async def _resume(coro, first):
    return await _Continue(coro, first)


class _Continue:
    """Awaiting it continues a coroutine that was started by hand and whose first step yielded ``first``: what
    ``yield from`` does for one that has not started (values sent and exceptions thrown in, cancellation among
    them, go through to it)."""

    __slots__ = ("coro", "first")

    def __init__(self, coro, first):
        self.coro, self.first = coro, first

    def __await__(self):
        coro, out = self.coro, self.first
        while True:
            try:
                sent = yield out
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    out = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    out = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


class _AsgiExchange:
    """One request to the ASGI fallback (the FastAPI app): the body is already read; ``http.disconnect`` when the
    client leaves; a response without a content-length is sent chunked."""

    def __init__(self, conn: _Connection, req: _Request, url, path: str):
        self.conn, self.req = conn, req
        transport = conn.transport
        server, client = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
        self.scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": req.http_version,
            "server": tuple(server[:2]) if isinstance(server, tuple) else None,
            "client": tuple(client[:2]) if isinstance(client, tuple) else None,
            "scheme": "http", "method": req.method, "root_path": "", "path": path, "raw_path": url.path,
            "query_string": url.query or b"", "headers": req.headers, "state": dict(conn.front.state),
        }
        self.body_sent = False
        self.started = self.complete = False
        self.chunked = False
        self.head = b""

    async def run(self) -> None:
        try:
            await self.conn.app(self.scope, self.receive, self.send)
        except Exception:
            log.exception("unexpected error serving %s %s", self.req.method, self.scope["path"])
            if not self.started:
                self.req.keep_alive = False
                self.conn.transport.write(b"%scontent-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\n"
                                          b"connection: close\r\n\r\nInternal Server Error" % _status_line(500))
            return
        if not self.complete:
            self.req.keep_alive = False  # the app ended without finishing its answer: the connection cannot be reused

    async def receive(self) -> dict:
        if not self.body_sent:
            self.body_sent = True
            return {"type": "http.request", "body": self.req.body, "more_body": False}
        await self.conn.lost
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if self.conn.gone:
            return
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("ASGI app sent http.response.start twice")
            self.started = True
            lines = [_status_line(message["status"])]
            has_length = False
            for name, value in message.get("headers", ()):
                name = name.lower()
                if name == b"content-length":
                    has_length = True
                elif name == b"connection" and b"close" in value.lower():
                    self.req.keep_alive = False
                    continue
                lines.append(b"%s: %s\r\n" % (name, value))
            if not has_length and self.req.method != "HEAD" and message["status"] not in (204, 304):
                self.chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
            if not self.req.keep_alive:
                lines.append(b"connection: close\r\n")
            self.head = b"".join(lines) + b"\r\n"
            return
        if kind != "http.response.body" or not self.started or self.complete:
            raise RuntimeError(f"ASGI app sent {kind!r} out of order")
        body, more = message.get("body", b""), message.get("more_body", False)
        if self.req.method == "HEAD":
            body = b""
        out = self.head
        self.head = b""
        if self.chunked:
            out += (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + (b"" if more else b"0\r\n\r\n")
        else:
            out += body
        self.conn.transport.write(out)
        if not more:
            self.complete = True
        await self.conn.drain()


class HttpServer:
    """Serve ``app`` (a ``ProxyApp``) on listening sockets until ``stop()``.

    ``serve()`` runs in the caller's event loop (the CLI's); ``start_in_thread()`` runs it in a thread with its own
    loop (the embedded proxy of ``openforge run``, tests)."""

    def __init__(self, app: ProxyApp, *, max_body: int, keepalive_s: float = 75.0, graceful_s: float = 30.0):
        self.app, self.max_body, self.keepalive_s, self.graceful_s = app, max_body, keepalive_s, graceful_s
        self.connections: set[_Connection] = set()
        self.stopping = False
        self.state: dict = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    async def serve(self, sockets: list[socket.socket]) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        lifespan = _Lifespan(self.app, self.state)
        await lifespan.startup()
        servers = [await self.loop.create_server(lambda: _Connection(self), sock=s, backlog=2048) for s in sockets]
        self.started.set()
        try:
            await self._stop.wait()
        finally:
            self.stopping = True
            for server in servers:
                server.close()
            for conn in list(self.connections):
                conn.shutdown()
            deadline = self.loop.time() + self.graceful_s
            while any(c.worker is not None for c in self.connections) and self.loop.time() < deadline:
                await asyncio.sleep(0.02)
            for conn in list(self.connections):  # past the grace period: cut what is left (relays record it)
                conn.transport.abort()
            await asyncio.sleep(0)
            await lifespan.shutdown()

    def stop(self) -> None:
        """Ask ``serve()`` to finish; callable from any thread."""
        if self.loop is None or self._stop is None:
            return
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self._stop.set)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def start_in_thread(self, sockets: list[socket.socket], *, name: str = "proxy-front", timeout_s: float = 15.0,
                        on_failure: Callable[[], Exception] | None = None) -> None:
        failed: list[BaseException] = []

        def run() -> None:
            import uvloop

            try:
                uvloop.run(self.serve(sockets))
            except BaseException as exc:  # start-up failed (the starter raises it) or serving did (logged here)
                if self.started.is_set():
                    log.exception("the proxy's server stopped on an error")
                failed.append(exc)
                self.started.set()

        self._thread = threading.Thread(target=run, daemon=True, name=name)
        self._thread.start()
        if not self.started.wait(timeout_s) or failed:
            if on_failure is not None:
                error = on_failure()
            elif failed:
                error = RuntimeError(f"the proxy's server did not start: {failed[0]!r}")
            else:
                error = RuntimeError(f"the proxy's server did not start in {timeout_s} s")
            raise error from (failed[0] if failed else None)

    def join(self, timeout_s: float = 10.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


class _Lifespan:
    """ASGI lifespan for ``app`` (the FastAPI app opens and closes the upstream client there)."""

    def __init__(self, app, state: dict):
        self.app, self.state = app, state
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None

    async def startup(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
        self.task = asyncio.get_running_loop().create_task(self.app(scope, self.inbox.get, self.outbox.put))
        await self.inbox.put({"type": "lifespan.startup"})
        reply = await self._reply()
        if reply["type"] == "lifespan.startup.failed":
            raise RuntimeError(f"the proxy's start-up failed: {reply.get('message', '')}")

    async def shutdown(self) -> None:
        if self.task is None or self.task.done():
            return
        await self.inbox.put({"type": "lifespan.shutdown"})
        await self._reply()

    async def _reply(self) -> dict:
        getter = asyncio.ensure_future(self.outbox.get())
        done, _ = await asyncio.wait({getter, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        self.task.result()  # the app's lifespan raised: let it surface
        return {"type": "lifespan.startup.complete"}  # the app does not speak lifespan: nothing to wait for
