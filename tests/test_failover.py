"""``proxy._failover.Failover``: one call's replicas, over a real ``UpstreamPool`` (no engine is reached: the attempt
is the test's, which says how each replica answered)."""

from __future__ import annotations

import asyncio

import pytest

from proxy import UpstreamFailure
from proxy._failover import Failover
from proxy._upstream import Upstream, UpstreamPool
from proxy._upstream.engine_info import EngineInfo

URLS = ["http://127.0.0.1:9101", "http://127.0.0.1:9102", "http://127.0.0.1:9103"]


def _pool(urls=URLS, models: list[tuple[str, ...]] | None = None) -> UpstreamPool:
    """``models``: what each replica's /v1/models lists (as a probe at start would have found), else unknown."""
    infos = {u: EngineInfo("vllm", "vllm", m) for u, m in zip(urls, models)} if models else None
    return UpstreamPool([Upstream(u) for u in urls], dialect="vllm", make=Upstream, infos=infos)


def _unreachable(url: str) -> UpstreamFailure:
    return UpstreamFailure(502, f"cannot connect to {url}", "upstream_unreachable")


def _run(pool: UpstreamPool, rollout_id: str | None, answers: dict[str, UpstreamFailure | str],
         model: str | None = None, chosen: bool = False):
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

    failover = Failover(pool, rollout_id, model, chosen)
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


# ---- replicas that serve different models (a teacher beside the policy) ----------------------------------------------
POLICY, TEACHERS = URLS[0], URLS[1:]
MODELS = [("policy-a",), ("teacher-big",), ("teacher-big",)]


def test_a_call_fails_over_only_to_a_replica_that_serves_its_model():
    pool = _pool(models=MODELS)
    answers = {u: "answer from " + u for u in URLS}
    first = pool.pick("r1", "teacher-big", True)
    first.calls -= 1
    result, attempts = _run(pool, "r1", answers | {first.url: _unreachable(first.url)}, "teacher-big", True)
    assert first.url in TEACHERS and [a[0] for a in attempts] == [first.url, *(set(TEACHERS) - {first.url})]
    assert result == "answer from " + attempts[1][0]
    with pytest.raises(UpstreamFailure, match="cannot connect"):   # the policy's one replica: nowhere else to go
        _run(pool, "r1", answers | {POLICY: _unreachable(POLICY)}, "policy-a", True)


def test_rollout_affinity_is_per_model_and_ends_with_the_rollout():
    pool = _pool(models=MODELS)
    picks = [(pool.pick("r1", "policy-a", True).url, pool.pick("r1", "teacher-big", True).url) for _ in range(4)]
    assert {p for p, _ in picks} == {POLICY} and len({t for _, t in picks}) == 1 and picks[0][1] in TEACHERS
    assert sum(r.bound for r in pool.replicas) == 2
    pool.forget("r1")
    assert sum(r.bound for r in pool.replicas) == 0
    other = pool.pick("r2", "unlisted", False)   # a name no replica lists, not chosen by the proxy: any replica
    assert other.url in URLS
