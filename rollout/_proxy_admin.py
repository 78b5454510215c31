"""How the orchestrator reaches the recording proxy: its admin API (HTTP), and a Unix socket for sandboxes.

``AdminClient`` is the orchestrator's only handle on the proxy; ``SocketRelay`` gives sandboxes a Unix socket that
forwards to a proxy's TCP address (``openforge run --proxy URL``), since a sandbox has no network. (A proxy served
in the orchestrator's own process is composition of two parts: ``openforge.embedded_proxy``.)
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path

import httpx


class ProxyUnavailable(RuntimeError):
    """The proxy's admin API did not answer or refused: an infrastructure problem, with what was tried."""


class AdminClient:
    def __init__(self, url: str, admin_token: str, *, timeout_s: float = 30.0):
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {admin_token}"})

    def _req(self, method: str, path: str, *, retry: bool = True, **kw) -> dict:
        """One admin request, retried on transport errors and 5xx answers. ``retry=False``, for a request that must
        not run twice (a pause: its first try may have taken the pause already), retries only a failed connect."""
        for attempt in range(4):
            try:
                r = self._http.request(method, path, **kw)
            except httpx.TransportError as exc:
                err = f"{type(exc).__name__}: {exc}"
                if not retry and not isinstance(exc, httpx.ConnectError):
                    break
                time.sleep(0.25 * 2 ** attempt)
                continue
            if r.status_code >= 500:
                err = f"HTTP {r.status_code}: {r.text[:300]}"
                if not retry:
                    break
                time.sleep(0.25 * 2 ** attempt)
                continue
            if r.status_code >= 400:
                raise ProxyUnavailable(f"proxy admin {method} {path} -> HTTP {r.status_code}: {r.text[:500]}")
            return r.json()
        raise ProxyUnavailable(f"proxy admin API at {self.url} unreachable ({method} {path}): {err}; is the proxy "
                               f"running and is --proxy right?")

    def register_rollout(self, *, max_calls: int | None = None, max_tokens: int | None = None,
                         max_wall_s: float | None = None, **fields) -> dict:
        """Register a rollout (``fields``: ``rollout_id``, ``task_id``, ``ttl_s``, ...); its answer has the token.
        The budget the proxy holds it to: at most ``max_calls`` model calls, ``max_tokens`` prompt + completion
        tokens, ``max_wall_s`` seconds from now; None: the proxy's default (its settings). Calls past it are refused
        (HTTP 400, code ``budget_exceeded``) and recorded. Only the limits given are sent (a proxy without budgets
        refuses fields it does not know)."""
        budget = {k: v for k, v in (("max_calls", max_calls), ("max_tokens", max_tokens),
                                    ("max_wall_s", max_wall_s)) if v is not None}
        return self._req("POST", "/admin/rollouts", json={**fields, **budget})

    def end_rollout(self, rollout_id: str, outcome: str | None = None, detail: str | None = None) -> dict:
        body = {"outcome": outcome, "detail": detail} if outcome else None
        return self._req("POST", f"/admin/rollouts/{rollout_id}/end", json=body)

    def status(self) -> dict:
        return self._req("GET", "/admin/status")

    def register_policy_version(self, id: str, model_name: str, *, activate: bool = True, **fields) -> dict:
        return self._req("POST", "/admin/policy_versions", json={"id": id, "model_name": model_name,
                                                                  "activate": activate, **fields})

    def activate_policy_version(self, id: str) -> dict:
        return self._req("POST", f"/admin/policy_versions/{id}/activate")

    def pause(self, *, drain: bool = True, timeout_s: float = 300.0) -> dict:
        """Hold new calls (they wait at the proxy) and, with ``drain``, wait up to ``timeout_s`` for the calls in
        flight to finish. The answer: ``paused``, ``was_paused`` (someone else holds the pause too), ``drained``
        (False: calls were still in flight at the timeout; None without drain), ``in_flight`` and the
        ``policy_version`` in force. A weight switch goes pause -> load -> activate -> resume
        (``openforge.policy_switch``)."""
        if timeout_s <= 0:
            raise ValueError(f"pause(timeout_s={timeout_s!r}): the drain needs a positive time limit in seconds, "
                             "e.g. timeout_s=300")
        # the HTTP wait outlasts the drain's own limit, so a slow drain answers "drained: false", not a client timeout
        return self._req("POST", "/admin/pause", json={"drain": drain, "timeout_s": timeout_s},
                         timeout=timeout_s + 30, retry=False)

    def resume(self) -> dict:
        """Let held and new calls through again (``was_paused``: whether the proxy was paused)."""
        return self._req("POST", "/admin/resume")

    def close(self) -> None:
        self._http.close()


def served_models(upstream: str) -> list[str]:
    """The model ids an OpenAI-compatible server lists at /v1/models (``upstream`` with or without /v1)."""
    root = upstream.rstrip("/").removesuffix("/v1")
    try:
        r = httpx.get(f"{root}/v1/models", timeout=10)
        r.raise_for_status()
        models = [m["id"] for m in r.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise ProxyUnavailable(f"{root}/v1/models did not answer with a model list ({type(exc).__name__}: {exc}); "
                               f"is the inference server running at that address?") from None
    if not models:
        raise ProxyUnavailable(f"{root}/v1/models lists no model: the server has nothing loaded")
    return models


def claim_socket(path: Path) -> None:
    """Make ``path`` free to bind: a stale socket (its process died) is removed; one that something still listens on
    is refused (``ProxyUnavailable``), since removing it would cut that proxy's sandboxes off."""
    path = Path(path)
    if path.exists():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1)
            try:
                probe.connect(str(path))
            except OSError:
                pass
            else:
                raise ProxyUnavailable(f"{path}: another proxy is listening on this socket (a second loop or run on "
                                       "this machine?); give this one a path of its own or stop the other")
    path.unlink(missing_ok=True)


class SocketRelay:
    """Listen on a Unix socket and forward each connection to ``host:port`` (an external proxy)."""

    def __init__(self, socket_path: Path, host: str, port: int):
        self.socket_path, self.host, self.port = Path(socket_path), host, port
        claim_socket(self.socket_path)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="socket-relay")
        self.thread.start()
        if not self._ready.wait(10):
            raise ProxyUnavailable(f"could not listen on {self.socket_path}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def pump(reader, writer):
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        async def handle(reader, writer):
            try:
                up_r, up_w = await asyncio.open_connection(self.host, self.port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pump(reader, up_w), pump(up_r, writer))

        async def main():
            self._server = await asyncio.start_unix_server(handle, str(self.socket_path))
            os.chmod(self.socket_path, 0o666)
            self._ready.set()
            await self._server.serve_forever()

        try:
            self._loop.run_until_complete(main())
        except asyncio.CancelledError:
            pass

    def stop(self) -> None:
        def _close():
            self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
        self._loop.call_soon_threadsafe(_close)
        self.thread.join(5)
        self.socket_path.unlink(missing_ok=True)
