"""API errors against the emulator (injected 404 / 409 / 429 / 500), concurrency limit, and reaping after a
simulated orchestrator crash."""

from __future__ import annotations

import threading
import time

import pytest

from rollout._backends.kubernetes import manifests
from rollout._backends.kubernetes.api import ApiError, TokenBucket

from .conftest import NS, make_spec

PODS = rf"^/api/v1/namespaces/{NS}/pods$"
SECRETS = rf"^/api/v1/namespaces/{NS}/secrets$"


def test_429_is_retried_honoring_retry_after(backend, emulator, task_dir):
    slept: list[float] = []
    backend.api._sleep = slept.append
    fault = emulator.inject("POST", PODS, 429, times=2, headers={"Retry-After": "3"})
    sb = backend.create(make_spec(task_dir))
    assert fault.hits == 2 and len(emulator.objects("pods")) == 1
    assert backend.api.counts["create pods"] == 3
    assert len(slept) == 2 and all(s >= 3 for s in slept)
    assert sb.id


def test_5xx_is_retried_with_growing_jittered_backoff(backend_factory, emulator, task_dir):
    backend = backend_factory(backoff_base_s=1, backoff_max_s=8)
    slept: list[float] = []
    backend.api._sleep = slept.append
    emulator.inject("POST", SECRETS, 500, times=1)
    emulator.inject("POST", SECRETS, 503, times=1)
    emulator.inject("POST", SECRETS, 502, times=1)
    backend.create(make_spec(task_dir))
    assert len(slept) == 3
    assert 0.5 <= slept[0] <= 1 and 1 <= slept[1] <= 2 and 2 <= slept[2] <= 4


def test_persistent_5xx_is_an_api_error_and_leaves_nothing_behind(backend_factory, emulator, task_dir):
    backend = backend_factory(max_retries=2)
    backend.api._sleep = lambda s: None
    emulator.inject("POST", PODS, 500, times=10)
    with pytest.raises(ApiError, match="after 3 attempts") as err:
        backend.create(make_spec(task_dir))
    assert err.value.kind == "api_error" and err.value.status == 500
    assert emulator.objects("pods") == [] and emulator.objects("secrets") == []
    assert emulator.objects("configmaps") == []


def test_other_4xx_fail_at_once(backend, emulator, task_dir):
    emulator.inject("POST", PODS, 403, times=1)
    with pytest.raises(ApiError, match="403") as err:
        backend.create(make_spec(task_dir))
    assert err.value.kind == "api_error" and backend.api.counts["create pods"] == 1


def test_409_for_this_rollout_is_idempotent(backend_factory, emulator, task_dir):
    # a POST that landed but whose response was lost: a second backend instance creates the same rollout again
    first = backend_factory()
    first.create(make_spec(task_dir, "r-same"))
    second = backend_factory()
    sb = second.create(make_spec(task_dir, "r-same"))
    assert sb.id == "of-r-same" and len(emulator.objects("pods")) == 1
    assert second.api.counts["get pods"] == 1 and second.api.counts["get secrets"] == 1


def test_409_for_another_rollout_is_an_error_that_says_the_fix(backend, emulator, task_dir):
    spec = make_spec(task_dir, "r-taken")
    pod, *_ = manifests.build(spec, backend.cfg, "img")
    pod["metadata"]["annotations"]["openforge.dev/rollout-id"] = "someone-else"
    backend.api.core.create_namespaced_pod(NS, pod, _preload_content=False)
    with pytest.raises(ApiError, match="taken by rollout 'someone-else'.*reap") as err:
        backend.create(spec)
    assert err.value.status == 409
    # the objects it made before the pod were removed again; the other rollout's pod stays
    assert [p["metadata"]["annotations"]["openforge.dev/rollout-id"] for p in emulator.objects("pods")] == \
        ["someone-else"]
    assert emulator.objects("secrets") == []


def test_404_on_delete_is_fine(backend, emulator, task_dir):
    sb = backend.create(make_spec(task_dir))
    emulator.inject("DELETE", rf"/pods/{sb.id}$", 404, times=1)
    backend.destroy(sb)
    assert emulator.objects("secrets") == [] and emulator.objects("configmaps") == []
    backend.destroy(sb)


def test_watch_survives_a_broken_stream(backend, kubelet, emulator, task_dir):
    emulator.inject("GET", PODS, 500, times=1)           # the first list of the watcher fails
    backend.api._sleep = lambda s: None
    sb = backend.create(make_spec(task_dir, service=False))
    threading.Thread(target=lambda: (time.sleep(0.3), kubelet.start(sb.id, "p-harness"),
                                     kubelet.finish(sb.id, "p-harness", wrapped_exit=0)), daemon=True).start()
    harness = next(p for p in sb.spec.phases if p.name == "harness")
    assert backend.run_phase(sb, harness).exit_code == 0


def test_max_pods_in_flight_blocks_create(backend_factory, task_dir):
    backend = backend_factory(max_pods_in_flight=1)
    a = backend.create(make_spec(task_dir, "r-a"))
    got = []
    t = threading.Thread(target=lambda: got.append(backend.create(make_spec(task_dir, "r-b"))), daemon=True)
    t.start()
    time.sleep(0.3)
    assert got == []
    backend.destroy(a)
    t.join(5)
    assert got and got[0].id == "of-r-b"


def test_reap_after_an_orchestrator_crash(backend_factory, emulator, task_dir):
    crashed = backend_factory()
    for rid, run in (("r-1", "run-1"), ("r-2", "run-1"), ("r-3", "run-2")):
        crashed.create(make_spec(task_dir, rid, run))
    crashed.close()                       # the orchestrator died: nobody calls destroy()
    del crashed
    fresh = backend_factory()
    removed = fresh.reap(run_id="run-1")
    assert sorted(r for r in removed if r.startswith("pods/")) == ["pods/of-r-1", "pods/of-r-2"]
    assert {p["metadata"]["name"] for p in emulator.objects("pods")} == {"of-r-3"}
    assert {s["metadata"]["name"] for s in emulator.objects("secrets")} == {"of-r-3"}
    assert all(c["metadata"]["name"].startswith("of-r-3") for c in emulator.objects("configmaps"))
    rest = fresh.reap()
    assert "pods/of-r-3" in rest and "secrets/of-r-3" in rest
    assert emulator.objects("pods") == [] and emulator.objects("configmaps") == []
    assert len(emulator.objects("networkpolicies")) == 1          # namespace-wide; not a leftover
    assert fresh.reap() == []


def test_token_bucket_paces_requests():
    now = [0.0]
    bucket = TokenBucket(qps=10, burst=2, clock=lambda: now[0])
    waits = []
    orig = time.sleep
    try:
        time.sleep = lambda s: waits.append(s)
        for _ in range(4):
            bucket.take()
    finally:
        time.sleep = orig
    assert waits == pytest.approx([0.1, 0.2])
