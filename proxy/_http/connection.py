"""One client connection of the proxy's HTTP server, an asyncio protocol whose requests httptools parses.

Requests are parsed as bytes arrive and queued; one task per busy connection answers them in order (pipelined
requests included). A model call is started eagerly (``eager``) and answered by ``ProxyApp.answer``; its reply goes
out in one write, a stream's events as chunks as they come, and a client that disconnects mid-stream cancels the
relay, which records what was sent. Any other request goes through the ASGI bridge. Writes wait while the client's
socket buffer is full.

A client is held to the server's ``HttpLimits`` (``limits`` says what each bounds): one read deadline at a time,
set from where the parser is after each read (a head's, a body's, or the idle one between requests while nothing is
being answered), never re-armed by bytes alone; reading pauses while ``max_pipelined`` requests wait; a write
deadline runs while the client's socket is full; past the connection cap a new connection gets a 503.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import urllib.parse

import httptools

from .._errors import ProxyError
from .._exchange import CALL_ID_HEADER, CallHeaders, Last, Reply, StreamReply, too_large
from .asgi_bridge import AsgiExchange
from .eager import start_eagerly
from .limits import BETWEEN, BODY, HEAD, WRITE_HIGH_WATER, Limited, head_too_large
from .status import status_line

log = logging.getLogger("proxy")

_STARTING = object()  # ``ClientConnection.worker`` while the worker runs its first step
_PIECE = 64 << 10  # bytes parsed at a time: between pieces the head is measured and reading can stop


def _call_id_line(call_id: str | None) -> bytes:
    """The head's line naming the stored call (``CALL_ID_HEADER``), or nothing where no call was recorded."""
    return b"" if call_id is None else b"%s: %s\r\n" % (CALL_ID_HEADER, call_id.encode())


class Request:
    """One request as parsed: its head, its body once whole, or the error to answer it with."""

    __slots__ = ("method", "url", "headers", "chunks", "size", "body", "keep_alive", "http_version", "upgrade",
                 "error", "head", "target")

    def __init__(self) -> None:
        self.method, self.url, self.headers, self.chunks, self.size = "", b"", [], [], 0
        self.body, self.keep_alive, self.http_version, self.upgrade = b"", True, "1.1", False
        self.error: ProxyError | None = None
        self.head = 0  # bytes of request line and headers so far
        self.target: tuple | None = None  # (parsed URL, path, model-call route or None), once parsed


class ClientConnection(Limited, asyncio.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, server):  # its HttpServer (which imports this module)
        self.server, self.app, self.limits = server, server.app, server.limits
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: collections.deque[Request] = collections.deque()
        self.queued = 0  # bytes of the requests in ``queue``
        self.cur: Request | None = None
        self.worker: asyncio.Task | None = None
        self.relaying = False  # the worker relays a stream: a disconnect cancels it
        self.gone = False
        self.stop_reading = False  # after an upgrade, an error or a body past the limit: nothing more is parsed
        self.paused, self.resume_due = False, False  # reading paused while ``max_pipelined`` requests wait
        self.backlog = b""  # read but not parsed when reading paused
        self.phase, self.begun, self.head_seen = BETWEEN, 0, 0  # where the parser is; requests begun; head bytes
        self.timed: tuple | None = (0, BETWEEN)  # the (begun, phase) the read deadline was set for
        self.deadline: asyncio.TimerHandle | None = None  # the read deadline (head, body or idle)
        self.deadline_kind: str | None = None
        self.write_timer: asyncio.TimerHandle | None = None  # runs while the client's socket is full
        self.refused = False  # over the connection cap: answered 503, closing
        self.lost = server.loop.create_future()  # resolves when the client disconnects (ASGI http.disconnect)
        self._writable: asyncio.Future | None = None

    # ---- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        if len(self.server.connections) >= self.server.max_connections:
            self._refuse_connection()
            return
        self.server.connections.add(self)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self._arm(self.limits.head_timeout_s, "first")  # a fresh connection's first head is due from the connect

    def connection_lost(self, exc) -> None:
        self.gone = True
        self.server.connections.discard(self)
        if self.refused:
            self.server.lingering -= 1
        self._arm(None)
        if self.write_timer is not None:
            self.write_timer.cancel()
        if not self.lost.done():
            self.lost.set_result(None)
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        if self.relaying and self.worker is not None:
            self.worker.cancel()

    def pause_writing(self) -> None:
        self._writable = self.loop.create_future()
        self.write_timer = self.loop.call_later(self.limits.write_timeout_s, self._write_expired)

    def resume_writing(self) -> None:
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def data_received(self, data: bytes) -> None:
        if self.stop_reading:
            return
        if self.paused:
            self.backlog += data
            return
        if len(data) <= _PIECE:
            self._feed(data)
        else:
            view = memoryview(data)
            for at in range(0, len(data), _PIECE):
                if self.stop_reading:
                    break
                if self.paused:
                    self.backlog = bytes(view[at:])
                    break
                self._feed(view[at:at + _PIECE])
        self._set_deadline()

    def _feed(self, piece) -> None:
        """Parse ``piece``; a head still incomplete after it is measured (the parser keeps a header being received
        to itself: a head's size is its pieces', less what of the first belonged to the request before)."""
        cur, in_head = self.cur, self.phase == HEAD
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:  # the upgrade request is complete; the connection ends after its answer
            self.stop_reading = True
        except httptools.HttpParserCallbackError:
            raise
        except httptools.HttpParserError as exc:
            self.stop_reading = True
            req = self.cur or Request()  # httptools began a message at the first bad byte: cur is that one
            req.error, req.keep_alive = ProxyError(400, f"malformed HTTP request ({exc}); send HTTP/1.1",
                                                   code="bad_http"), False
            self._enqueue(req)
            return
        if self.phase == HEAD and not self.stop_reading:
            self.head_seen = self.head_seen + len(piece) if in_head and self.cur is cur else 0
            size = max(self.head_seen, self.cur.head)
            if size > self.limits.max_head_bytes:
                self._refuse_current(head_too_large(size, self.limits.max_head_bytes))

    def _refuse_current(self, error: ProxyError) -> None:
        """Answer the request being received with ``error`` without reading the rest; the connection closes."""
        req = self.cur
        req.error, req.keep_alive, req.chunks = error, False, []
        self.stop_reading = True
        self._enqueue(req)

    # ---- httptools callbacks --------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.cur = Request()
        self.phase, self.head_seen = HEAD, 0
        self.begun += 1

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
        self.phase = BODY
        if cur.head > self.limits.max_head_bytes:
            cur.error = head_too_large(cur.head, self.limits.max_head_bytes)
        expect = False
        for name, value in cur.headers:
            if name == b"content-length" and value.isdigit() and int(value) > self.server.max_body:
                cur.error = too_large(self.server.max_body, int(value))
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
        if cur.size > self.server.max_body:
            cur.error, cur.chunks = too_large(self.server.max_body), []
            cur.keep_alive, self.stop_reading = False, True
            self._enqueue(cur)
            return
        cur.chunks.append(body)

    def on_message_complete(self) -> None:
        cur = self.cur
        self.phase = BETWEEN
        if cur.error is not None:
            return
        cur.body = cur.chunks[0] if len(cur.chunks) == 1 else b"".join(cur.chunks)
        cur.chunks = None
        if cur.upgrade:
            cur.keep_alive = False
        self._enqueue(cur)

    # ---- answering ----------------------------------------------------------------------------------------------
    def _enqueue(self, req: Request) -> None:
        self.queue.append(req)
        self.queued += req.size + req.head
        if self.worker is None:
            if req.error is not None or req.method != "POST" or not self._model_call(req):
                self.worker = self.loop.create_task(self._serve())
            else:
                self.worker = _STARTING  # requests parsed while it starts queue behind it
                task = start_eagerly(self.loop, self._serve())
                if self.worker is _STARTING:  # still at work (it sets None itself when it ends before its first wait)
                    self.worker = task
        if not (self.paused or self.stop_reading) and (len(self.queue) >= self.limits.max_pipelined
                                                       or self.queued > self.server.max_body):
            self.paused = True  # read no more until the answers catch up (``_resume``)
            self.transport.pause_reading()

    def _model_call(self, req: Request) -> bool:
        try:
            return self._target(req)[2] is not None
        except httptools.HttpParserInvalidURLError:
            return False

    def _target(self, req: Request) -> tuple:
        """``req``'s parsed URL, its path, and its route if it is a model call (else None); parsed once."""
        if req.target is None:
            url = httptools.parse_url(req.url)
            path = url.path.decode("latin-1")
            if "%" in path:
                path = urllib.parse.unquote(path)
            hit = self.app.route(path, url.query or b"") if req.method == "POST" and not req.upgrade else None
            req.target = url, path, hit
        return req.target

    async def _serve(self) -> None:
        try:
            while self.queue and not self.gone:
                req = self.queue.popleft()
                self.queued -= req.size + req.head
                if self.paused and not self.resume_due and len(self.queue) < self.limits.max_pipelined \
                        and self.queued <= self.server.max_body:
                    self.resume_due = True  # not from here: this may run inside the parser (an eager start)
                    self.loop.call_soon(self._resume)
                if req.error is not None:
                    self._refuse(req)  # it closes the connection when the client has read the answer
                    return
                await self._dispatch(req)
                await self.drain()  # the next answer waits until the client reads: output stays bounded
                if not req.keep_alive or self.server.stopping:
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

    async def _dispatch(self, req: Request) -> None:
        url, path, hit = self._target(req)
        if hit is not None:
            protocol, api_path, token = hit
            reply = await self.app.answer(protocol, api_path, token, CallHeaders.from_asgi(req.headers), None, req.body)
            if reply is None or self.gone:
                if isinstance(reply, StreamReply) and reply.abandon is not None:
                    reply.abandon()
                return
            if isinstance(reply, StreamReply):
                await self._relay(reply, req.keep_alive)
            else:
                self._write_reply(reply, req.keep_alive)
            return
        await AsgiExchange(self, req, url, path).run()

    def _refuse(self, req: Request) -> None:
        """Answer a request that was not read (malformed, head or body too large), then close. The client may still
        be sending: half-close and keep discarding what comes, so that the kernel does not reset the connection
        (and lose the answer) before the client has read it."""
        try:
            path = httptools.parse_url(req.url).path.decode("latin-1")
        except httptools.HttpParserInvalidURLError:
            path = "/"
        self._write_reply(self.app.error_reply(req.error, path), False)
        self._linger_close()

    def _write_reply(self, reply: Reply, keep_alive: bool) -> None:
        head = b"%scontent-type: %s\r\ncontent-length: %d\r\n%s%s\r\n" % (
            status_line(reply.status), reply.content_type.encode(), len(reply.body), _call_id_line(reply.call_id),
            b"" if keep_alive else b"connection: close\r\n")
        self.transport.write(head + reply.body)

    async def _relay(self, reply: StreamReply, keep_alive: bool) -> None:
        """Chunked transfer of ``reply``; the relay is cancelled if the client leaves (it records what was sent).

        The head leaves with the first events, not on its own: one write (and one wake-up of the client) fewer per
        stream. A client waits for the first event either way; its read timeout runs the same."""
        chunks = reply.chunks
        self.relaying = True
        head = b"%scontent-type: %s\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n%s%s\r\n" % (
            status_line(reply.status), reply.content_type.encode(), _call_id_line(reply.call_id),
            b"" if keep_alive else b"connection: close\r\n")
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
        if self.server.stopping:
            self.transport.close()
        elif self.phase == BETWEEN and not self.paused:  # else a begun request's deadline runs
            self.timed = (self.begun, BETWEEN)
            self._arm(self.limits.idle_timeout_s, "idle")

    def shutdown(self) -> None:
        """Server stopping: an idle connection closes now, a busy one after its current answer."""
        if self.worker is None:
            self.transport.close()
