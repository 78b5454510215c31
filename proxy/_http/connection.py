"""One client connection of the proxy's HTTP server, an asyncio protocol whose requests httptools parses.

Requests are parsed as bytes arrive and queued; one task per busy connection answers them in order (pipelined
requests included). A model call is started eagerly (``eager``) and answered by ``ProxyApp.answer``; its reply goes
out in one write, a stream's events as chunks as they come, and a client that disconnects mid-stream cancels the
relay, which records what was sent. Any other request goes through the ASGI bridge. Writes wait while the client's
socket buffer is full; an idle keep-alive connection closes after the server's ``keepalive_s``.
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
from .status import status_line

log = logging.getLogger("proxy")

_MAX_HEAD = 64 << 10  # request line and headers; past it: 431
_STARTING = object()  # ``Connection.worker`` while the worker runs its first step


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


class Connection(asyncio.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, front):  # its HttpServer (which imports this module)
        self.front, self.app = front, front.app
        self.loop = front.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: collections.deque[Request] = collections.deque()
        self.cur: Request | None = None
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
            req = self.cur or Request()  # httptools began a message at the first bad byte: cur is that one
            req.error, req.keep_alive = ProxyError(400, f"malformed HTTP request ({exc}); send HTTP/1.1",
                                                   code="bad_http"), False
            self._enqueue(req)

    # ---- httptools callbacks --------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.cur = Request()

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
    def _enqueue(self, req: Request) -> None:
        self.queue.append(req)
        if self.worker is None:
            if self.idle is not None:  # a request of the same read: the connection is busy again
                self.idle.cancel()
                self.idle = None
            if req.error is not None or req.method != "POST" or not self._model_call(req):
                self.worker = self.loop.create_task(self._serve())
                return
            self.worker = _STARTING  # requests parsed while it starts queue behind it
            task = start_eagerly(self.loop, self._serve())
            if self.worker is _STARTING:  # still at work (it sets None itself when it ends before its first wait)
                self.worker = task

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
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(2.0, self.transport.close)

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
