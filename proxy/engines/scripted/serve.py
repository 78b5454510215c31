"""``run_upstream``: a `ScriptedUpstream` served on a free loopback port for the length of a ``with`` block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .server import UpstreamServer
from .upstream import ScriptedUpstream

__all__ = ["run_upstream"]


@contextlib.contextmanager
def run_upstream(upstream: ScriptedUpstream | None = None, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `upstream` (a default one if None) on a free loopback port; yields the root URL.

    OpenAI clients want `base_url=url + "/v1"`; `/tokenize` and `/health` live at the root, as in vLLM.
    """
    if upstream is None:
        from .upstream import ScriptedUpstream

        upstream = ScriptedUpstream()
    server = UpstreamServer(upstream, host, port)
    server.start()
    try:
        yield server.base_url
    finally:
        server.stop()
