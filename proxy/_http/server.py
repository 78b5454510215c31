"""The proxy's own HTTP/1.1 server (``HttpServer``): model calls straight to ``ProxyApp.answer``, the rest via ASGI.

A proxied call crosses this server twice (request in, answer out), and in ``bench/proxy_overhead.py`` the
general-purpose ASGI server under it (uvicorn: a scope dict, a request-response cycle object and an event per
request, header validation and an ASGI message per send) was the largest cost left on a call's path after the
proxy's own work. Here httptools parses, the body is read whole (held to the body limit while it arrives), and a
model call's reply goes out in one write, a stream's events as chunks as they come. Every other route (health,
metrics, models, token counting, the admin API, websocket handshakes) is served by the FastAPI app through a
small ASGI bridge, so its behaviour does not depend on which server runs it; ``ProxyApp`` stays a plain ASGI app
that any ASGI server can serve.

Measured with ``bench/proxy_overhead.py --quick`` on the 2-core machine (2026-12-03, while another job loaded it),
the same recording proxy on this server (three runs) and on uvicorn with httptools and uvloop (``--server uvicorn``,
one run): the proxy's own time per call (its ``openforge_proxy_overhead_seconds``, p50) 0.59-0.74 ms at one client
and 0.47-0.55 ms at 16 against uvicorn's 0.95 and 0.90; CPU per recorded call 0.38-0.44 ms above the bare
pass-through's (``bench/passthrough_proxy.py``, on uvicorn) against uvicorn's 0.56. End to end the uvicorn run was
slower still (added p50 1.36 ms at one client and 8.1 at 16, against 0.87-0.98 and 1.5-3.0), but the machine was
busier during it (direct requests/s at 64 clients 1,347 against 1,753-2,270), so only the figures inside the proxy
and those relative to the bare pass-through compare.

``connection`` serves one client connection, held to the ``HttpLimits`` of ``limits`` (deadlines for a request's
head and body, an idle timeout, the head size, pipelined requests, a write timeout, a connection cap: a client
facing server needs them all), ``asgi_bridge`` the routes that go through ASGI, ``eager`` starts a model call in the
step that parsed it. ``stop()`` stops accepting, closes idle connections, lets calls in flight
finish for up to ``graceful_s`` and then cuts them (their relays record what was sent).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable

from .._asgi_app import ProxyApp
from .asgi_bridge import Lifespan
from .connection import ClientConnection
from .limits import HttpLimits

log = logging.getLogger("proxy")


class HttpServer:
    """Serve ``app`` (a ``ProxyApp``) on listening sockets until ``stop()``.

    ``serve()`` runs in the caller's event loop (the CLI's); ``start_in_thread()`` runs it in a thread with its own
    loop (the embedded proxy of ``openforge run``, tests)."""

    def __init__(self, app: ProxyApp, *, max_body: int, limits: HttpLimits | None = None, graceful_s: float = 30.0):
        """``limits``: by default from the environment's settings (``HttpLimits.from_settings``)."""
        self.app, self.max_body, self.graceful_s = app, max_body, graceful_s
        self.limits = limits if limits is not None else HttpLimits.from_settings()
        self.max_connections = self.limits.max_connections  # lowered at start to what the descriptor limit allows
        self.lingering = 0  # connections refused over the cap and closing
        self.connections: set[ClientConnection] = set()
        self.stopping = False
        self.state: dict = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    async def serve(self, sockets: list[socket.socket]) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.max_connections = self.limits.connection_cap()
        lifespan = Lifespan(self.app, self.state)
        await lifespan.startup()
        servers = [await self.loop.create_server(lambda: ClientConnection(self), sock=s, backlog=2048) for s in sockets]
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
