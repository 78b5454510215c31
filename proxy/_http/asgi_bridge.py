"""The bridge from the proxy's HTTP server to an ASGI app, for every route but the model calls (health, metrics,
models, the protocols' side routes, the admin API, websocket handshakes): ``AsgiExchange`` serves one request whose
body is already read, ``Lifespan`` runs the app's start-up and shutdown (the operator app opens and closes the
upstream client there). The operator app so behaves the same whichever server runs it."""

from __future__ import annotations

import asyncio
import logging

from .status import status_line

log = logging.getLogger("proxy")


class AsgiExchange:
    """One request to the ASGI fallback (the FastAPI app): the body is already read; ``http.disconnect`` when the
    client leaves; a response without a content-length is sent chunked."""

    def __init__(self, conn, req, url, path: str):  # a connection.ClientConnection and its connection.Request
        self.conn, self.req = conn, req
        transport = conn.transport
        server, client = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
        self.scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": req.http_version,
            "server": tuple(server[:2]) if isinstance(server, tuple) else None,
            "client": tuple(client[:2]) if isinstance(client, tuple) else None,
            "scheme": "http", "method": req.method, "root_path": "", "path": path, "raw_path": url.path,
            "query_string": url.query or b"", "headers": req.headers, "state": dict(conn.server.state),
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
                                          b"connection: close\r\n\r\nInternal Server Error" % status_line(500))
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
            lines = [status_line(message["status"])]
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


class Lifespan:
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
