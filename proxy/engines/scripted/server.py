"""Serve an ASGI double (a `ScriptedUpstream`'s `.app`) on loopback with uvicorn in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

__all__ = ["UpstreamServer"]


class UpstreamServer:
    """Serves ``upstream.app`` (a `ScriptedUpstream`'s) with uvicorn in a background thread; `stop()` makes it
    unreachable."""

    def __init__(self, upstream: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream, self.host, self.port = upstream, host, port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]  # a free port when 0 was asked; kept for a restart
        config = uvicorn.Config(
            self.upstream.app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the scripted upstream did not start on {self.base_url} within {timeout} s.")
            time.sleep(0.01)
        return self.base_url

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(5)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(5)
        self._server = self._thread = None
