"""Prometheus metrics of one proxy (its own registry, so several proxies can live in one process in tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from forge_store import CallRecord

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls = Counter("openforge_proxy_calls", "Recorded calls", ["surface", "outcome", "token_exact"], registry=r)
        self.latency = Histogram("openforge_proxy_call_seconds", "Call latency, request to last byte",
                                 ["surface"], buckets=_LATENCY, registry=r)
        self.ttft = Histogram("openforge_proxy_ttft_seconds", "Time to first token (streams)", ["surface"],
                              buckets=_LATENCY, registry=r)
        self.journal = Histogram("openforge_proxy_journal_seconds", "Time to journal a call", registry=r,
                                 buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 1))
        self.overhead = Histogram(
            "openforge_proxy_overhead_seconds", "The proxy's own time per answered (non-streaming) call: from the "
            "request to its answer, less the wait for the upstream's answer", registry=r,
            buckets=(0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.0006, 0.0008, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01,
                     0.025, 0.1, 1))
        self.record_failures = Counter("openforge_proxy_record_failures", "Calls that could not be journaled",
                                       registry=r)
        self.errors = Counter("openforge_proxy_errors", "Requests answered with an error by the proxy itself",
                              ["status", "code"], registry=r)
        self.in_flight = Gauge("openforge_proxy_in_flight", "Calls in flight", registry=r)
        self.store_pending = Gauge("openforge_proxy_store_pending_ops", "Journaled writes not yet in the database",
                                   registry=r)
        self.paused = Gauge("openforge_proxy_paused", "1 while new calls are held (weight update)", registry=r)
        self._children: dict[tuple, tuple] = {}

    def observe_call(self, rec: CallRecord, journal_s: float) -> None:
        key = (rec.api_surface, rec.error_class or "ok", rec.token_exact)
        children = self._children.get(key)
        if children is None:  # labels() costs a lock and a dict walk per call: look each combination up once
            surface, outcome, exact = key
            children = self._children[key] = (self.calls.labels(surface, outcome, str(exact).lower()),
                                               self.latency.labels(surface), self.ttft.labels(surface))
        calls, latency, ttft = children
        calls.inc()
        self.journal.observe(journal_s)
        if rec.latency_ms is not None:
            latency.observe(rec.latency_ms / 1000)
        if rec.ttft_ms is not None:
            ttft.observe(rec.ttft_ms / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)
