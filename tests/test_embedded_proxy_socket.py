"""Two loops (or a loop and a run, or a test) on one machine share the sandboxes' root; each embedded proxy gets a
socket of its own there, and a proxy never binds over, nor removes, a socket another one is listening on. (Before:
both used ``proxy.sock``, and a second loop's start left the first one's sandboxes with no socket: every rollout an
infra error, "bwrap: Can't find source path .../proxy.sock".)"""

from __future__ import annotations

import os
import socket

import pytest

from forge_store import Settings, open_store
from openforge.embedded_proxy import EmbeddedProxy, own_socket
from rollout import ProxyUnavailable, SocketRelay


def test_a_live_socket_is_refused_and_a_stale_one_replaced(tmp_path):
    settings = Settings(home=tmp_path / "home")
    path = own_socket(tmp_path)
    assert path == tmp_path / f"proxy-{os.getpid()}.sock" and own_socket(tmp_path, "teacher") != path
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()   # the file stays, nothing listens: what a killed process leaves
    with open_store(f"sqlite:///{tmp_path / 'store.sqlite'}", settings=settings) as store:
        first = EmbeddedProxy("http://127.0.0.1:9/v1", store=store, settings=settings, socket_path=path)
        try:
            with pytest.raises(ProxyUnavailable, match="another proxy is listening on this socket"):
                EmbeddedProxy("http://127.0.0.1:9/v1", store=store, settings=settings, socket_path=path)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:   # the first one's socket is still there
                c.connect(str(path))
        finally:
            first.stop()
    assert not path.exists()


def test_the_relay_to_an_external_proxy_claims_its_socket_the_same_way(tmp_path):
    """``openforge run --proxy URL`` relays sandboxes to an external proxy over the same kind of socket."""
    path = own_socket(tmp_path)
    first = SocketRelay(path, "127.0.0.1", 9)
    try:
        with pytest.raises(ProxyUnavailable, match="another proxy is listening on this socket"):
            SocketRelay(path, "127.0.0.1", 9)
    finally:
        first.stop()
