"""Contract tests against an emulated API server (kmock over loopback HTTP, official client): a rollout's pod
from creation through the status transitions a kubelet writes, to results, events and deletion."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import threading
import time

import pytest

from rollout._backends.base import SandboxBackend, SandboxError
from rollout._backends.kubernetes.results import message

from .conftest import NS, REWARD, TOKEN, make_spec


def phases(sb):
    return {p.name: p for p in sb.spec.phases}


def test_it_is_a_sandbox_backend(backend):
    assert isinstance(backend, SandboxBackend) and backend.name == "kubernetes"
    assert backend.proxy_url() == "http://openforge-proxy.openforge.svc:8000"


def test_create_makes_secret_configmaps_pod_and_one_network_policy(backend, emulator, task_dir):
    a = backend.create(make_spec(task_dir, "r-1"))
    backend.create(make_spec(task_dir, "r-2"))
    pods = {p["metadata"]["name"]: p for p in emulator.objects("pods")}
    assert set(pods) == {"of-r-1", "of-r-2"}
    assert pods["of-r-1"]["metadata"]["labels"]["openforge.dev/rollout"] == "r-1"
    secret = next(s for s in emulator.objects("secrets") if s["metadata"]["name"] == a.backend_state["secret"])
    assert json.loads(json.dumps(secret))["data"]["token"]
    assert TOKEN not in json.dumps(emulator.objects("pods")) + json.dumps(emulator.objects("configmaps"))
    assert {c["metadata"]["name"] for c in emulator.objects("configmaps")} >= set(a.backend_state["configmaps"])
    assert len(emulator.objects("networkpolicies")) == 1 and emulator.counts["create networkpolicies"] == 1
    assert a.started_ms > 0


def _happy(k, pod):
    k.schedule(pod, node="gpu-node-7")
    k.event(pod, "Pulling", "Pulling image ghcr.io/example/task-image:1.0")
    k.start(pod, "seed")
    k.finish(pod, "seed", exit_code=0)
    k.start(pod, "p-mock-api")
    time.sleep(0.2)
    k.start(pod, "p-harness")
    k.finish(pod, "p-harness", wrapped_exit=1, log="Traceback: boom\n")
    k.start(pod, "p-verifier", phase="Running")
    k.finish(pod, "p-verifier", wrapped_exit=0, outputs={REWARD: b'{"reward": 1.0}'}, phase="Succeeded",
             log="1 passed\n")


def test_full_lifecycle(backend, kubelet, emulator, task_dir, in_thread):
    sb = backend.create(make_spec(task_dir))
    t = in_thread(_happy, kubelet, sb.id)
    ph = phases(sb)
    svc = backend.run_phase(sb, ph["mock-api"])
    assert svc.exit_code == 0 and not svc.timed_out
    harness = backend.run_phase(sb, ph["harness"])
    assert harness.exit_code == 1 and b"Traceback: boom" in harness.stdout     # a failed harness ...
    verifier = backend.run_phase(sb, ph["verifier"])                            # ... still gets graded
    assert verifier.exit_code == 0 and verifier.outputs == {REWARD: b'{"reward": 1.0}'}
    t.join()
    d = backend.describe(sb)
    assert d["pod_name"] == sb.id and d["node_name"] == "gpu-node-7"
    assert d["image_ref"] == "ghcr.io/example/task-image:1.0" and d["image_digest"].startswith("sha256:")
    events = backend.events(sb)
    reasons = [e["reason"] for e in events]
    assert reasons[:2] == ["Scheduled", "Pulling"] and "Started" in reasons
    assert "events" not in d          # one API list per call of events(), never hidden inside describe()
    emulator.set_log(sb.id, "p-mock-api", "serving on 9000\n")
    assert "serving on 9000" in backend.logs(sb)
    backend.destroy(sb)
    backend.destroy(sb)                                   # idempotent: 404s are fine
    assert emulator.objects("pods") == [] and emulator.objects("secrets") == []
    assert emulator.objects("configmaps") == []
    # the digest seen is pinned for the next pod of the same image
    sb2 = backend.create(make_spec(task_dir, "r-next"))
    assert sb2.backend_state["image"] == "ghcr.io/example/task-image:1.0@" + d["image_digest"]


def test_one_shared_watch_for_many_rollouts(backend, kubelet, task_dir, in_thread):
    sbs = [backend.create(make_spec(task_dir, f"r-{i}", service=False)) for i in range(3)]
    for sb in sbs:
        in_thread(lambda pod: (kubelet.start(pod, "p-verifier"), kubelet.finish(pod, "p-verifier", wrapped_exit=0)),
                  sb.id)
        assert backend.run_phase(sb, phases(sb)["verifier"]).exit_code == 0
    assert backend.watcher.watches_opened == 1


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "ErrImagePull", "InvalidImageName"])
def test_image_pull_failure_is_infra(backend, kubelet, task_dir, reason, in_thread):
    sb = backend.create(make_spec(task_dir, service=False))
    in_thread(lambda: (kubelet.schedule(sb.id), kubelet.pull_error(sb.id, "seed", reason)))
    with pytest.raises(SandboxError, match=reason) as err:
        backend.run_phase(sb, phases(sb)["harness"])
    assert err.value.kind == "image_pull"
    assert "Failed" in [e["reason"] for e in backend.events(sb)]


def test_image_pull_gets_a_grace(backend_factory, kubelet, task_dir, in_thread):
    backend = backend_factory(image_pull_grace_s=30)
    sb = backend.create(make_spec(task_dir, service=False))

    def kube():
        kubelet.pull_error(sb.id, "p-harness", "ErrImagePull")      # transient: the kubelet retries
        time.sleep(0.3)
        kubelet.start(sb.id, "p-harness")
        kubelet.finish(sb.id, "p-harness", wrapped_exit=0)
    in_thread(kube)
    assert backend.run_phase(sb, phases(sb)["harness"]).exit_code == 0


def test_unschedulable_after_grace(backend_factory, kubelet, task_dir, in_thread):
    backend = backend_factory(unschedulable_grace_s=0.3)
    sb = backend.create(make_spec(task_dir, service=False))
    in_thread(kubelet.unschedulable, sb.id)
    t0 = time.monotonic()
    with pytest.raises(SandboxError, match="Insufficient memory") as err:
        backend.run_phase(sb, phases(sb)["harness"])
    assert err.value.kind == "unschedulable" and time.monotonic() - t0 >= 0.3


@pytest.mark.parametrize("reason,kind", [("Evicted", "evicted"), ("DeadlineExceeded", "deadline_exceeded")])
def test_pod_level_failures_are_infra(backend, kubelet, task_dir, reason, kind, in_thread):
    sb = backend.create(make_spec(task_dir, service=False))

    def kube():
        kubelet.start(sb.id, "p-harness", phase="Running")
        time.sleep(0.1)
        kubelet.fail_pod(sb.id, reason, "The node was low on resource: memory." if kind == "evicted" else
                         "Pod was active on the node longer than the specified deadline")
    in_thread(kube)
    with pytest.raises(SandboxError) as err:
        backend.run_phase(sb, phases(sb)["harness"])
    assert err.value.kind == kind


def test_oom_of_the_harness_is_a_harness_error(backend, kubelet, task_dir, in_thread):
    sb = backend.create(make_spec(task_dir, service=False))
    in_thread(lambda: (kubelet.start(sb.id, "p-harness"),
                       kubelet.finish(sb.id, "p-harness", exit_code=137, reason="OOMKilled", msg="")))
    r = backend.run_phase(sb, phases(sb)["harness"])
    assert r.exit_code == 137 and b"OOM-killed" in r.stderr and b"4096 MiB" in r.stderr


def test_oom_of_the_seed_is_infra(backend, kubelet, task_dir, in_thread):
    sb = backend.create(make_spec(task_dir, service=False))
    in_thread(lambda: (kubelet.start(sb.id, "seed"),
                       kubelet.finish(sb.id, "seed", exit_code=137, reason="OOMKilled", phase="Failed")))
    with pytest.raises(SandboxError) as err:
        backend.run_phase(sb, phases(sb)["harness"])
    assert err.value.kind == "oom_killed"


def test_deadline_counts_from_container_start_not_from_pull(backend, kubelet, emulator, task_dir, in_thread):
    spec = make_spec(task_dir, service=False, harness_timeout=0.6)
    sb = backend.create(spec)

    def kube():
        kubelet.schedule(sb.id)
        kubelet.event(sb.id, "Pulling", "Pulling image (slow registry)")
        time.sleep(1.0)                                        # longer than the phase's timeout: not counted
        now = datetime.datetime.now(tz=datetime.UTC).isoformat()  # sub-second, so the test can time it
        kubelet.start(sb.id, "p-harness", started_at=now)      # it never finishes
    in_thread(kube)
    t0 = time.monotonic()
    r = backend.run_phase(sb, phases(sb)["harness"])
    took = time.monotonic() - t0
    assert r.timed_out and r.exit_code is None
    assert took >= 1.0 + 0.6 - 0.1
    assert emulator.objects("pods") == []                      # deleted with grace 0
    assert backend.describe(sb)["killed"] == "timeout"


def test_cancel_deletes_the_pod(backend, emulator, task_dir):
    sb = backend.create(make_spec(task_dir, service=False))
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    r = backend.run_phase(sb, phases(sb)["harness"], cancel=cancel)
    assert r.cancelled and r.exit_code is None and emulator.objects("pods") == []


def test_pod_deleted_by_someone_else_is_sandbox_lost(backend, kubelet, task_dir, in_thread):
    sb = backend.create(make_spec(task_dir, service=False))
    in_thread(lambda: (time.sleep(0.1), kubelet.core.delete_namespaced_pod(sb.id, NS, _preload_content=False)))
    with pytest.raises(SandboxError, match="not by this backend") as err:
        backend.run_phase(sb, phases(sb)["harness"])
    assert err.value.kind == "sandbox_lost"


def test_result_above_the_termination_message_limit_comes_from_the_log(backend, kubelet, task_dir, in_thread):
    sb = backend.create(make_spec(task_dir, service=False))
    big = b"z" * 6000
    full = message(0, {REWARD: big})
    log = f"verifier output\n@@openforge-result-begin@@{full}@@openforge-result-end@@\n"
    in_thread(lambda: (kubelet.start(sb.id, "p-verifier"),
                       kubelet.finish(sb.id, "p-verifier", msg='{"v":1,"exit":0,"timed_out":0,"overflow":1}',
                                      log=log)))
    r = backend.run_phase(sb, phases(sb)["verifier"])
    assert r.outputs == {REWARD: big} and r.stdout.strip() == b"verifier output"


def test_importing_the_backend_does_not_import_kubernetes():
    code = ("import sys, rollout, rollout._backends.kubernetes as k; "
            "assert 'kubernetes' not in sys.modules, 'kubernetes imported'; print(k.__all__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
