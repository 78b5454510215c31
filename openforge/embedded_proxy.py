"""A recording proxy served in this process for the orchestrator (``openforge run --upstream``, the demo).

The proxy and the orchestrator are peers that meet only through the proxy's admin API; serving one beside the other
in one process is composition, so it lives here, above both.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from proxy import HttpLimits, HttpServer, build_proxy
from rollout import ProxyUnavailable


class EmbeddedProxy:
    """A recording proxy served (on the proxy's own HTTP server, as ``openforge proxy`` serves it) in a thread, on a
    free loopback port and on a Unix socket that sandboxes reach."""

    def __init__(self, upstream_url: str, *, store, settings, socket_path: Path, dialect: str = "vllm",
                 policy_version: str | None = None, upstream_api_key: str | None = None):
        self.proxy = build_proxy(upstream_url, settings=settings, store=store, dialect=dialect,
                                 policy_version=policy_version, upstream_api_key=upstream_api_key)
        tcp = socket.socket()
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind(("127.0.0.1", 0))
        self.socket_path = Path(socket_path)
        self.socket_path.unlink(missing_ok=True)
        uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        uds.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o666)
        self.url = f"http://127.0.0.1:{tcp.getsockname()[1]}"
        self.admin_token = self.proxy.admin_token
        self.server = HttpServer(self.proxy.app, max_body=settings.proxy_max_body_bytes, graceful_s=2,
                                 limits=HttpLimits.from_settings(settings))
        self.server.start_in_thread([tcp, uds], name="embedded-proxy", on_failure=lambda: ProxyUnavailable(
            "the embedded proxy did not start (see the log above)"))

    def stop(self) -> None:
        self.server.stop()
        self.server.join(10)
        self.socket_path.unlink(missing_ok=True)
