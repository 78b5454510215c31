"""Backpressure, asked before every rollout starts: the proxy's admin status (paused, calls in flight) and the
upstream engine's queue (vLLM's ``vllm:num_requests_waiting`` on its Prometheus endpoint, summed over models)."""

from __future__ import annotations

import time

import httpx

from ._proxy_admin import AdminClient


class Backpressure:
    """Answers "may a rollout start now?" from the proxy's admin status and the upstream's queue, cached briefly."""

    def __init__(self, admin: AdminClient, *, max_in_flight: int | None, metrics_url: str | None,
                 max_waiting: int | None, interval_s: float = 0.25):
        self.admin, self.max_in_flight = admin, max_in_flight
        self.metrics_url, self.max_waiting = metrics_url, max_waiting
        self.interval_s, self._at, self._status = interval_s, 0.0, {}
        self.reason: str | None = None

    def status(self) -> dict:
        if time.monotonic() - self._at > self.interval_s:
            self._status, self._at = self.admin.status(), time.monotonic()
        return self._status

    def blocked(self) -> str | None:
        st = self.status()
        if st.get("paused"):
            return "proxy paused (weights changing)"
        if self.max_in_flight is not None and st.get("in_flight", 0) >= self.max_in_flight:
            return f"proxy in-flight calls {st['in_flight']} >= {self.max_in_flight}"
        if self.metrics_url and self.max_waiting is not None:
            waiting = _vllm_waiting(self.metrics_url)
            if waiting is not None and waiting >= self.max_waiting:
                return f"upstream queue {waiting:g} >= {self.max_waiting}"
        return None


def _vllm_waiting(url: str) -> float | None:
    try:
        text = httpx.get(url, timeout=2).text
    except httpx.HTTPError:
        return None
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_waiting"):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    return total if seen else None
