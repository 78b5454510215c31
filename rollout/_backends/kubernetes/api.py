"""The backend's one door to the API server: raw JSON in and out, a client-side QPS budget, retries, counts.

Objects stay plain dicts (``_preload_content=False``): the generated models validate strictly and reject the
partial objects a watch or an older server can send. 429 and 5xx (and dropped connections) are retried with
exponential backoff and equal jitter (``forge_store.Backoff``), never sooner than the server's ``Retry-After``; other errors raise
``ApiError`` (a ``SandboxError`` of kind ``api_error``) at once. Every request is counted by verb and resource.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from forge_store import Backoff

from ..base import SandboxError
from .config import KubernetesConfig

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class ApiError(SandboxError):
    """An API request that failed for good; ``status`` is the HTTP status (0: no response)."""

    def __init__(self, message: str, *, status: int):
        super().__init__(message, kind="api_error")
        self.status = status


class TokenBucket:
    """``qps`` tokens per second, at most ``burst`` saved up; ``take`` blocks until one is free."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.qps, self.burst, self._clock = qps, burst, clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Take one token; returns the seconds waited."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if wait:
            time.sleep(wait)
        return wait


def require_client() -> None:
    """The ``kubernetes`` package is an optional extra: without it, say how to get it rather than a bare ImportError."""
    try:
        import kubernetes  # noqa: F401
    except ImportError as exc:
        raise SandboxError(f"the kubernetes sandbox backend needs the `kubernetes` package, which could not be "
                           f"imported ({exc}); install the k8s extra: pip install 'openforge[k8s]'",
                           kind="sandbox_missing") from exc


def make_api_client(cfg: KubernetesConfig, host: str | None = None):
    """An official ``ApiClient``: ``host`` (tests, the emulator), else kubeconfig (``cfg.context``), else
    in-cluster."""
    from kubernetes import client
    from kubernetes import config as kconfig

    conf = client.Configuration()
    if host is not None:
        conf.host = host
    else:
        try:
            kconfig.load_kube_config(context=cfg.context, client_configuration=conf)
        except kconfig.ConfigException:
            if cfg.context:
                raise
            kconfig.load_incluster_config(client_configuration=conf)
    conf.connection_pool_maxsize = max(4, min(64, cfg.max_pods_in_flight))
    conf.retries = 0                          # retries are ours (status-aware, with backoff)
    return client.ApiClient(conf)


class Api:
    def __init__(self, cfg: KubernetesConfig, api_client, *, sleep: Callable[[float], None] = time.sleep):
        from kubernetes import client

        self.cfg = cfg
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.net = client.NetworkingV1Api(api_client)
        self.bucket = TokenBucket(cfg.qps, cfg.burst)
        self.counts: collections.Counter[str] = collections.Counter()
        self.throttled_s = 0.0
        self._sleep = sleep
        self._lock = threading.Lock()

    def count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def call(self, verb: str, resource: str, fn: Callable[..., Any], *args: Any, raw: bool = False,
             **kwargs: Any) -> Any:
        """One API request with budget and retries; JSON-decoded (``raw``: text) body."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        kwargs.setdefault("_request_timeout", self.cfg.request_timeout_s)
        delays = self.backoff()
        for attempt in range(self.cfg.max_retries + 1):
            waited = self.bucket.take()
            self.count(f"{verb} {resource}")
            try:
                resp = fn(*args, _preload_content=False, **kwargs)
                data = resp.data.decode("utf-8", errors="replace")
                return data if raw else (json.loads(data) if data else {})
            except ApiException as exc:
                status, headers, body = exc.status or 0, exc.headers or {}, exc.body
                if status not in RETRY_STATUSES:
                    raise ApiError(f"{verb} {resource}: HTTP {status} {exc.reason}: {_message(body)}",
                                   status=status) from None
                retry_after = _retry_after(headers)
            except HTTPError as exc:
                status, retry_after = 0, None
                body = str(exc)
            finally:
                with self._lock:
                    self.throttled_s += waited
            if attempt == self.cfg.max_retries:
                raise ApiError(f"{verb} {resource}: still HTTP {status or 'no response'} ({_message(body)}) after "
                               f"{attempt + 1} attempts; the API server is overloaded or down. Lower qps / "
                               f"max_pods_in_flight or raise max_retries", status=status)
            self._sleep(delays.next(retry_after))
        raise AssertionError("unreachable")

    def backoff(self) -> Backoff:
        """The delays between tries of one request (or one watch): from ``backoff_base_s``, doubling up to
        ``backoff_max_s``, each drawn from the upper half of its step."""
        return Backoff(self.cfg.backoff_base_s, self.cfg.backoff_max_s, jitter=True)


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None          # an HTTP date: fall back to our own backoff


def _message(body: Any) -> str:
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    try:
        obj = json.loads(body) if body else {}
    except json.JSONDecodeError:
        return str(body)[:300]
    return str(obj.get("message", obj))[:300] if isinstance(obj, dict) else str(obj)[:300]
