"""``proxy._failover.Failover``: one call's replicas, over a real ``UpstreamPool`` (no engine is reached: the attempt
is the test's, which says how each replica answered)."""

from __future__ import annotations

import asyncio

import pytest

from proxy import UpstreamFailure
from proxy._failover import Failover
from proxy._upstream import Upstream, UpstreamPool

URLS = ["http://127.0.0.1:9101", "http://127.0.0.1:9102", "http://127.0.0.1:9103"]


def _pool(urls=URLS) -> UpstreamPool:
    return UpstreamPool([Upstream(u) for u in urls], dialect="vllm", make=Upstream)


def _unreachable(url: str) -> UpstreamFailure:
    return UpstreamFailure(502, f"cannot connect to {url}", "upstream_unreachable")


def _run(pool: UpstreamPool, rollout_id: str | None, answers: dict[str, UpstreamFailure | str]):
    """Run a call whose attempt at each replica fails or answers as ``answers`` says; each failed attempt names its
    call (``call-<n>``), as the service's recorded failures do. Returns (result, attempts as (url, retry))."""
    attempts: list[tuple[str, tuple[str, str] | None]] = []

    async def attempt(replica, retry):
        attempts.append((replica.url, retry))
        outcome = answers[replica.url]
        if isinstance(outcome, UpstreamFailure):
            failure = UpstreamFailure(outcome.status, outcome.message, outcome.error_class)
            failure.call_id = f"call-{len(attempts)}"
            raise failure
        return outcome

    failover = Failover(pool, rollout_id)
    return asyncio.run(failover.run(attempt)), attempts


def test_a_connection_failure_goes_to_another_replica_as_a_retry_of_the_failed_call():
    pool = _pool()
    first = pool.pick("r1")  # binds r1; the call below goes there first
    first.calls -= 1
    answers = {u: "answer from " + u for u in URLS} | {first.url: _unreachable(first.url)}
    result, attempts = _run(pool, "r1", answers)
    assert attempts[0] == (first.url, None)
    assert len(attempts) == 2 and attempts[1][1] == ("call-1", first.url)
    assert result == "answer from " + attempts[1][0] and attempts[1][0] != first.url
    assert first.state == "down" and pool.pick("r1").url == attempts[1][0]  # the rollout now bound there


def test_a_failure_that_is_not_a_connection_failure_is_the_calls_answer():
    pool = _pool()
    timeout = UpstreamFailure(504, "the upstream sent nothing for 600s", "upstream_timeout")
    with pytest.raises(UpstreamFailure, match="sent nothing") as caught:
        _run(pool, "r1", {u: timeout for u in URLS})
    assert caught.value.call_id == "call-1"  # tried once
    assert all(r.state == "up" for r in pool.replicas)


def test_every_replica_unreachable_tries_each_once_then_raises_the_last_failure():
    pool = _pool()
    with pytest.raises(UpstreamFailure) as caught:
        _run(pool, None, {u: _unreachable(u) for u in URLS})
    assert caught.value.call_id == "call-3"
    assert sorted(r.failures for r in pool.replicas) == [1, 1, 1]


def test_one_replica_is_never_failed_over():
    pool = _pool(URLS[:1])
    with pytest.raises(UpstreamFailure, match="cannot connect"):
        _run(pool, "r1", {URLS[0]: _unreachable(URLS[0])})
    assert pool.replicas[0].failures == 1 and pool.replicas[0].state == "up"  # nowhere else: it stays tried
