"""A recording proxy served in this process for the orchestrator (``openforge run --upstream``, the demo), and in
front of a model serving a role (the synthesis teacher, the judge: :func:`role_proxy`, whose calls are each a rollout
of their own through :class:`ChatRollouts`).

The proxy and the orchestrator are peers that meet only through the proxy's admin API; serving one beside the other
in one process is composition, so it lives here, above both.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from proxy import HttpLimits, HttpServer, ProxySettings, build_proxy
from rollout import AdminClient, ProxyUnavailable, claim_socket


def own_socket(root: Path, name: str = "proxy") -> Path:
    """This process's socket path under the sandboxes' root: two loops, runs or tests on one machine share the root
    (``/var/tmp/openforge/sandboxes`` as root) and must not bind, nor remove, each other's socket."""
    return Path(root) / f"{name}-{os.getpid()}.sock"


class EmbeddedProxy:
    """A recording proxy served (on the proxy's own HTTP server, as ``openforge proxy`` serves it) in a thread, on a
    free loopback port and on a Unix socket that sandboxes reach."""

    def __init__(self, upstream_url: str, *, store, settings, socket_path: Path, dialect: str = "vllm",
                 policy_version: str | None = None, upstream_api_key: str | None = None,
                 proxy_settings: ProxySettings | None = None):
        self.socket_path = Path(socket_path)
        claim_socket(self.socket_path)   # before anything is built: a refusal leaves nothing to close
        proxy_settings = proxy_settings if proxy_settings is not None else ProxySettings()
        self.proxy = build_proxy(upstream_url, settings=settings, store=store, dialect=dialect,
                                 policy_version=policy_version, upstream_api_key=upstream_api_key,
                                 proxy_settings=proxy_settings)
        tcp = socket.socket()
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind(("127.0.0.1", 0))
        uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        uds.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o666)
        self.url = f"http://127.0.0.1:{tcp.getsockname()[1]}"
        self.admin_token = self.proxy.admin_token
        self.server = HttpServer(self.proxy.app, max_body=proxy_settings.max_body_bytes, graceful_s=2,
                                 limits=HttpLimits.from_settings(proxy_settings))
        self.server.start_in_thread([tcp, uds], name="embedded-proxy", on_failure=lambda: ProxyUnavailable(
            "the embedded proxy did not start (see the log above)"))

    def stop(self) -> None:
        self.server.stop()
        self.server.join(10)
        self.socket_path.unlink(missing_ok=True)


def served_model(upstream: str, model: str | None) -> str:
    """``model``, or the first model ``upstream`` serves; an error naming what it serves when it does not serve it."""
    from rollout import served_models

    served = served_models(upstream)
    if model and model not in served:
        raise ValueError(f"--model {model!r} is not served by {upstream} (it serves {', '.join(served)}); "
                         f"pass --model {served[0]}")
    return model or served[0]


@dataclass
class RoleProxy:
    """A store and a recording proxy in front of one model serving a role (``teacher``, ``judge``)."""

    store: object
    admin: AdminClient
    url: str
    model: str
    policy_version: str
    sandbox_root: Path


@contextlib.contextmanager
def role_proxy(upstream: str, *, role: str, model: str | None, name: str, dialect: str = "openai",
               store_url: str | None = None, settings=None) -> Iterator[RoleProxy]:
    """Open the store, serve a recording proxy in front of ``upstream`` and register the policy version
    ``<role>:<model>``; on a clean exit wait for the store's writes; stop the proxy and close the store either way."""
    from forge_store import get_settings, open_store

    settings = settings or get_settings()
    model = served_model(upstream, model)
    root = settings.resolved_sandbox_dir()
    root.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(open_store(store_url, journal=True, name=name, settings=settings))
        proxy = EmbeddedProxy(upstream, store=store, settings=settings, socket_path=root / f"{name}-proxy.sock",
                              dialect=dialect)
        stack.callback(proxy.stop)
        admin = stack.enter_context(contextlib.closing(AdminClient(proxy.url, proxy.admin_token)))
        version = f"{role}:{model}"
        admin.register_policy_version(version, model, metadata={"role": role, "url": upstream})
        yield RoleProxy(store, admin, proxy.url, model, version, root)
        store.flush(60)


@dataclass
class ChatReply:
    rollout_id: str
    call_id: str | None
    text: str


class ChatRollouts:
    """One chat completion per rollout through the recording proxy at ``proxy_url``: each call is registered as a
    rollout of its own (``purpose`` in its metadata), so it is recorded like any other. :meth:`ask` ends the rollout
    ``infra_error`` (and raises ``error``) when the model cannot be reached or fails; otherwise the rollout stays open
    for the caller to end with its verdict on the answer."""

    def __init__(self, *, admin, proxy_url: str, run_id: str, model: str, policy_version: str | None, purpose: str,
                 who: str, error: type[Exception]):
        self.admin, self.proxy_url, self.run_id = admin, proxy_url.rstrip("/"), run_id
        self.model, self.policy_version, self.purpose, self.who, self.error = model, policy_version, purpose, who, error
        self.http = httpx.Client(timeout=600)

    def ask(self, system: str, prompt: str, *, temperature: float, metadata: dict) -> ChatReply:
        rid = f"ro-{uuid.uuid4().hex[:16]}"
        reg = self.admin.register_rollout(rollout_id=rid, task_id=None, run_id=self.run_id,
                                          policy_version_id=self.policy_version, ttl_s=900,
                                          metadata={"purpose": self.purpose, **metadata})
        try:
            r = self.http.post(f"{self.proxy_url}/r/{reg['token']}/v1/chat/completions", json={
                "model": self.model, "temperature": temperature,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}]})
        except httpx.HTTPError as exc:
            self.admin.end_rollout(rid, "infra_error", f"{self.who} unreachable: {exc}")
            raise self.error(f"the {self.who} could not be reached ({exc})") from None
        if r.status_code != 200:
            self.admin.end_rollout(rid, "infra_error", f"{self.who} answered HTTP {r.status_code}: {r.text[:500]}")
            raise self.error(f"the {self.who} answered HTTP {r.status_code}: {r.text[:300]}")
        text = r.json()["choices"][0]["message"].get("content") or ""
        return ChatReply(rid, r.headers.get("x-openforge-call-id"), text)

    def close(self) -> None:
        self.http.close()
