"""The proxy's ASGI entry: harness calls go straight to ``ProxyService``; every other route to the operator app.

A model call is the proxy's hot path, and a framework's per-request machinery (middleware stack, routing,
dependency solving, a task group per streamed answer) costs more CPU than the call's own work: measured in-process,
FastAPI spent 66 us on a bare JSON answer and 186 us on an 8-chunk stream, against 1-4 us for plain ASGI. So the
POST routes of the wire protocols (``proxy._protocols.registry``; also under ``/r/{token}/``) are dispatched here by
a dict lookup and answered with raw ASGI messages; health, metrics, models, the protocols' side routes (token
counting, the websocket refusal) and the admin API stay on FastAPI (``proxy._operator_api``), where validation and
docs matter more than microseconds.
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from ._errors import ProxyError
from ._exchange import CALL_ID_HEADER, CallHeaders, ClientGone, Last, Reply, StreamReply
from ._metrics import Metrics
from ._protocols.contract import WireProtocol
from ._protocols.registry import Protocols
from ._service import ProxyService

log = logging.getLogger("proxy")


def error_reply(exc: ProxyError, body: dict, metrics: Metrics) -> Reply:
    """``exc`` counted, answered with ``body`` (its API's error shape: ``WireProtocol.error_body``). Both edges
    answer errors through this: the hot routes here and the operator app's exception handler."""
    metrics.errors.labels(str(exc.status), exc.code or "").inc()
    return Reply(exc.status, orjson.dumps(body))


class ProxyApp:
    """ASGI app: the model calls of ``protocols`` go to ``service``; the rest goes to ``fallback``."""

    def __init__(self, service: ProxyService, protocols: Protocols, fallback):
        self.service, self.protocols, self.fallback = service, protocols, fallback
        self.route = protocols.route  # (protocol, API path, token) for a model call's path, else None

    def error_reply(self, exc: ProxyError, path: str) -> Reply:
        """``exc`` in the error shape of the API ``path`` speaks (for requests no protocol took up)."""
        return error_reply(exc, self.protocols.error_body(exc, path), self.service.metrics)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and (
                hit := self.route(scope["path"], scope.get("query_string", b""))) is not None:
            protocol, path, token = hit
            reply = await self.answer(protocol, path, token, CallHeaders.from_asgi(scope["headers"]), receive)
            if reply is None:
                return
            if isinstance(reply, StreamReply):
                await self._stream(reply, receive, send)
                return
            headers = [(b"content-type", reply.content_type.encode()),
                       (b"content-length", str(len(reply.body)).encode())]
            if reply.call_id is not None:
                headers.append((CALL_ID_HEADER, reply.call_id.encode()))
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            await send({"type": "http.response.body", "body": reply.body})
            return
        await self.fallback(scope, receive, send)

    async def answer(self, protocol: WireProtocol, path: str, token: str | None, headers: CallHeaders, receive,
                     body: bytes | None = None) -> Reply | StreamReply | None:
        """The reply to one model call (errors as replies in the API's shape); None when the client left before its
        request arrived. ``body``: the request body when the server has read it already, else ``receive`` reads it.
        Both servers go through here: this ASGI app's ``__call__`` and the proxy's own HTTP server (``proxy._http``)."""
        try:
            return await self.service.call(headers, receive, protocol, token, body)
        except ClientGone:
            return None
        except ProxyError as exc:
            reply = error_reply(exc, protocol.error_body(exc), self.service.metrics)
            reply.call_id = getattr(exc, "call_id", None)  # set by the service on an error it recorded
            return reply
        except Exception:
            log.exception("unexpected error serving %s", path)
            exc = ProxyError(500, "the proxy failed on this request (a bug: its log has the traceback); retry, and "
                                  "report it if it repeats", type="server_error", code="proxy_internal_error")
            return error_reply(exc, protocol.error_body(exc), self.service.metrics)

    @staticmethod
    async def _stream(reply: StreamReply, receive, send) -> None:
        """Relay ``reply`` chunk by chunk. A client that disconnects stops the relay (and so the upstream stream):
        ``receive`` says so, and the relay is cancelled wherever it waits, which records what was sent."""
        chunks = reply.chunks
        relay = asyncio.current_task()
        gone = False

        def on_message(watch: asyncio.Task) -> None:
            nonlocal gone
            if not watch.cancelled() and watch.exception() is None and watch.result()["type"] == "http.disconnect":
                gone = True
                relay.cancel()

        watch = asyncio.ensure_future(receive())
        watch.add_done_callback(on_message)
        try:
            headers = [(b"content-type", reply.content_type.encode()), (b"cache-control", b"no-cache")]
            if reply.call_id is not None:  # assigned before the first byte: it goes out with the head
                headers.append((CALL_ID_HEADER, reply.call_id.encode()))
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            ended = False
            async for chunk in chunks:
                ended = type(chunk) is Last  # the final piece ends the body: one send, not two
                if chunk or ended:
                    await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
            watch.remove_done_callback(on_message)
            if not ended:
                await send({"type": "http.response.body", "body": b""})
        except asyncio.CancelledError:
            if not gone:
                raise
            relay.uncancel()
        finally:
            watch.remove_done_callback(on_message)
            watch.cancel()
            await chunks.aclose()
            if reply.abandon is not None:  # a relay that never started cannot clean up after itself
                reply.abandon()
