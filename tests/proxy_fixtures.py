"""Fixtures for proxy tests: the scripted upstream and a proxy, both served over real loopback HTTP."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass

import httpx
import openai
import pytest
import uvicorn

from forge_store import Settings
from proxy import HttpServer, Proxy, ProxySettings, build_proxy
from proxy._asgi_app import ProxyApp
from proxy.engines.scripted import ScriptedUpstream, UpstreamServer, load_smollm2_tokenizer


class ServeInThread:
    """Serve an app in a background thread on a free loopback port: a ``ProxyApp`` on the proxy's own HTTP server
    (``proxy._http``, what ``openforge proxy`` runs), any other ASGI app, or a ProxyApp with ``server="uvicorn"``
    (the ASGI path other servers take), on uvicorn with lifespan on."""

    def __init__(self, app, port: int = 0, server: str = "front"):
        self.app, self.port = app, port
        self.kind = "front" if server == "front" and isinstance(app, ProxyApp) else "uvicorn"
        self.server = self.thread = None

    def start(self) -> str:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        if self.kind == "front":
            self.server = HttpServer(self.app, max_body=self.app.service.max_body, graceful_s=2)
            self.server.start_in_thread([sock])
            return f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", access_log=False,
                                                    timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.kind == "front":
            self.server.stop()
            self.server.join(10)
            return
        self.server.should_exit = True
        self.thread.join(10)


@dataclass
class Up:
    double: ScriptedUpstream
    url: str
    server: UpstreamServer


@dataclass
class ProxyHarness:
    proxy: Proxy
    url: str
    up: Up
    server: object = None  # what serves it (a HttpServer, or uvicorn's Server)

    @property
    def store(self):
        return self.proxy.store

    def admin(self, method: str, path: str, **kw) -> httpx.Response:
        return httpx.request(method, self.url + path, headers={"Authorization": f"Bearer {self.proxy.admin_token}"},
                             timeout=30, **kw)

    def register(self, rollout_id: str | None = None, **fields) -> str:
        r = self.admin("POST", "/admin/rollouts", json={"rollout_id": rollout_id, **fields})
        assert r.status_code == 200, r.text
        return r.json()["token"]

    def end(self, rollout_id: str, outcome: str | None = None) -> None:
        r = self.admin("POST", f"/admin/rollouts/{rollout_id}/end", json={"outcome": outcome} if outcome else None)
        assert r.status_code == 200, r.text

    def client(self, token: str, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=token, max_retries=0, **kw)

    def async_client(self, token: str, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=token, max_retries=0, **kw)

    def calls(self, rollout_id: str):
        assert self.store.flush(30)
        return self.store.calls(rollout_id)


@pytest.fixture(scope="session")
def tokenizer():
    return load_smollm2_tokenizer()


@pytest.fixture
def up(tokenizer):
    double = ScriptedUpstream(tokenizer=tokenizer)
    server = UpstreamServer(double)
    url = server.start()
    yield Up(double, url, server)
    server.stop()


def split_settings(home, settings: dict) -> tuple[Settings, ProxySettings]:
    """``proxy_*`` keyword settings (named as their OPENFORGE_PROXY_* variables) for ``ProxySettings``, the rest for
    the store's ``Settings``."""
    ours = {k.removeprefix("proxy_"): v for k, v in settings.items() if k.startswith("proxy_")}
    return (Settings(home=home, **{k: v for k, v in settings.items() if not k.startswith("proxy_")}),
            ProxySettings(**ours))


def make_proxy(up: Up, tmp_path, store_url: str | None = None, **settings) -> tuple[ProxyHarness, ServeInThread]:
    s, ps = split_settings(tmp_path / "proxy-home", settings)
    proxy = build_proxy(up.url, settings=s, store_url=store_url or f"sqlite:///{tmp_path / 'proxy.sqlite'}",
                        proxy_settings=ps)
    serve = ServeInThread(proxy.app)
    url = serve.start()
    return ProxyHarness(proxy, url, up, serve.server), serve


@contextlib.contextmanager
def running_proxy(up: Up, tmp_path, **settings):
    """``make_proxy`` for one ``with`` block: the harness, then stopped and its store closed."""
    harness, serve = make_proxy(up, tmp_path, **settings)
    try:
        yield harness
    finally:
        serve.stop()
        harness.store.close()


@pytest.fixture
def px(up, tmp_path):
    harness, serve = make_proxy(up, tmp_path)
    yield harness
    serve.stop()
    harness.store.close()
