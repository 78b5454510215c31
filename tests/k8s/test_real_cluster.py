"""The backend against a real cluster. Skipped unless KUBECONFIG or OPENFORGE_K8S_CONTEXT points at a reachable
cluster; run with ``pytest tests/k8s -m k8s_cluster``. Needs a namespace the kubeconfig may create pods, secrets,
configmaps and networkpolicies in (OPENFORGE_K8S_NAMESPACE, default openforge-test) and nodes that can pull
``busybox`` (OPENFORGE_K8S_IMAGE). The egress test also needs a CNI that enforces NetworkPolicy."""

from __future__ import annotations

import json
import os
import uuid

import pytest

pytestmark = pytest.mark.k8s_cluster

CONTEXT = os.environ.get("OPENFORGE_K8S_CONTEXT")
NAMESPACE = os.environ.get("OPENFORGE_K8S_NAMESPACE", "openforge-test")
IMAGE = os.environ.get("OPENFORGE_K8S_IMAGE", "busybox:1.36")
REWARD = "/logs/verifier/reward.json"


def _reachable() -> str | None:
    if not (os.environ.get("KUBECONFIG") or CONTEXT):
        return "set KUBECONFIG or OPENFORGE_K8S_CONTEXT to run the real-cluster tests"
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError
    try:
        config.load_kube_config(context=CONTEXT)
        client.VersionApi().get_code(_request_timeout=5)
    except (config.ConfigException, ApiException, HTTPError, OSError) as exc:
        return f"cluster unreachable: {exc}"
    return None


@pytest.fixture(scope="module")
def backend():
    problem = _reachable()
    if problem:
        pytest.skip(problem)
    from rollout._backends.kubernetes import KubernetesBackend, KubernetesConfig
    be = KubernetesBackend(KubernetesConfig(namespace=NAMESPACE, context=CONTEXT, default_image=IMAGE,
                                            read_only_root_fs=True, image_pull_grace_s=120))
    yield be
    be.reap(run_id="k8s-cluster-test")
    be.close()


def _spec(tmp_path, argv, rollout_id=None):
    from rollout._backends.base import Mount, Phase, SandboxSpec
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "hello.txt").write_text("hello\n")
    tests = tmp_path / "tests"
    tests.mkdir(exist_ok=True)
    (tests / "test.sh").write_text(f'grep -q done /workspace/out.txt && echo \'{{"reward": 1}}\' > {REWARD} '
                                   f'|| echo \'{{"reward": 0}}\' > {REWARD}\n')
    return SandboxSpec(
        rollout_id=rollout_id or f"it-{uuid.uuid4().hex[:8]}", run_id="k8s-cluster-test", group_id="g", task_id="t",
        workspace_seed=ws, environment_dir=None, proxy_token="secret-token",
        phases=(Phase("harness", ("/bin/sh", "-c", argv), timeout_s=60, env={"OPENAI_API_KEY": "secret-token"}),
                Phase("verifier", ("/bin/sh", "/tests/test.sh"), timeout_s=60, clean=True,
                      mounts=(Mount(tests, "/tests"),), outputs=(REWARD,))))


def test_a_rollout_runs_end_to_end(backend, tmp_path):
    spec = _spec(tmp_path, 'cat hello.txt && [ "$OPENAI_API_KEY" = secret-token ] && echo done > out.txt')
    sb = backend.create(spec)
    try:
        harness = backend.run_phase(sb, spec.phases[0])
        assert harness.exit_code == 0, harness
        assert b"hello" in harness.stdout
        verifier = backend.run_phase(sb, spec.phases[1])
        assert json.loads(verifier.outputs[REWARD]) == {"reward": 1}
        d = backend.describe(sb)
        assert d["image_digest"] and d["node_name"] and any(e["reason"] == "Pulled" or e["reason"] == "Pulling"
                                                            for e in backend.events(sb))
    finally:
        backend.destroy(sb)


def test_harness_deadline_from_container_start(backend, tmp_path):
    from rollout._backends.base import Phase
    spec = _spec(tmp_path, "sleep 120")
    spec = type(spec)(**{**spec.__dict__, "phases": (Phase("harness", ("/bin/sh", "-c", "sleep 120"), timeout_s=5),
                                                    spec.phases[1])})
    sb = backend.create(spec)
    try:
        r = backend.run_phase(sb, spec.phases[0])
        assert r.timed_out and r.exit_code is None       # the in-pod `timeout` ended it; the verifier can still run
        v = backend.run_phase(sb, spec.phases[1])
        assert json.loads(v.outputs[REWARD]) == {"reward": 0}
    finally:
        backend.destroy(sb)


def test_egress_other_than_the_proxy_is_blocked(backend, tmp_path):
    spec = _spec(tmp_path, "wget -q -T 5 -O /dev/null http://1.1.1.1/ && echo reachable; echo done > out.txt")
    sb = backend.create(spec)
    try:
        r = backend.run_phase(sb, spec.phases[0])
        assert b"reachable" not in r.stdout
    finally:
        backend.destroy(sb)


def test_bad_image_is_an_image_pull_error(backend, tmp_path):
    from rollout._backends.base import SandboxError
    spec = _spec(tmp_path, "true")
    spec = type(spec)(**{**spec.__dict__, "image": "registry.invalid/openforge/none:0"})
    sb = backend.create(spec)
    try:
        with pytest.raises(SandboxError) as err:
            backend.run_phase(sb, spec.phases[0])
        assert err.value.kind == "image_pull"
    finally:
        backend.destroy(sb)
