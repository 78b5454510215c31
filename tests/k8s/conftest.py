"""Fixtures for the Kubernetes backend: a kmock API server on loopback, a fake kubelet, specs from a task folder."""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

import pytest

for _mod in ("kubernetes", "kmock"):
    if importlib.util.find_spec(_mod) is None:
        _msg = f"the Kubernetes backend and its emulator tests need {_mod}: `pip install 'openforge[k8s]'`"
        if os.environ.get("CI"):  # a skip is a failure in CI: the dev extra installs both
            raise RuntimeError(_msg)
        pytest.skip(_msg, allow_module_level=True)

from rollout._backends.base import Mount, Phase, Resources, SandboxSpec  # noqa: E402
from rollout._backends.kubernetes import KubernetesBackend, KubernetesConfig  # noqa: E402
from tests.doubles.k8s_emulator import Emulator, FakeKubelet  # noqa: E402

NS = "openforge-test"
TOKEN = "of-rollout-token-7f3a"
REWARD = "/logs/verifier/reward.json"


@pytest.fixture
def task_dir(tmp_path) -> Path:
    root = tmp_path / "task"
    (root / "environment" / "workspace" / "src").mkdir(parents=True)
    (root / "environment" / "workspace" / "src" / "main.py").write_text("print('hi')\n")
    (root / "environment" / "workspace" / "data.bin").write_bytes(bytes(range(256)))
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("#!/bin/sh\necho '{\"reward\": 1}' > /logs/verifier/reward.json\n")
    (root / "tests" / "test.sh").chmod(0o755)
    return root


def make_spec(task_dir: Path, rollout_id: str = "r-0001", run_id: str = "run-1", *, service: bool = True,
              harness_timeout: float = 600.0) -> SandboxSpec:
    phases = []
    if service:
        phases.append(Phase("mock-api", ("python", "-m", "http.server", "9000"), background=True, ready_port=9000,
                            timeout_s=10))
    phases += [
        Phase("harness", ("mini-swe-agent", "--task", "fix it", "--api-key", TOKEN), timeout_s=harness_timeout,
              env={"OPENAI_API_KEY": TOKEN, "OPENAI_BASE_URL": "http://openforge-proxy.openforge.svc:8000/v1",
                   "AUTH_HEADER": f"Bearer {TOKEN}", "LITERAL": "$(NOT_A_VAR) costs $5"},
              files=(("/home/openforge/.config/agent.toml", f'api_key = "{TOKEN}"\n'.encode(), 0o600),)),
        Phase("verifier", ("/bin/sh", "/tests/test.sh"), timeout_s=120, clean=True,
              mounts=(Mount(task_dir / "tests", "/tests"), Mount(None, "/logs/verifier", writable=True)),
              outputs=(REWARD,)),
    ]
    return SandboxSpec(rollout_id=rollout_id, run_id=run_id, group_id="group-1", task_id="fix-bug",
                       workspace_seed=task_dir / "environment" / "workspace", environment_dir=task_dir / "environment",
                       phases=tuple(phases), image="ghcr.io/example/task-image:1.0",
                       resources=Resources(cpus=2, memory_mb=4096, storage_mb=2048), proxy_token=TOKEN)


def config(**kw) -> KubernetesConfig:
    base = dict(namespace=NS, image_pull_grace_s=0, unschedulable_grace_s=0, deadline_grace_s=0,
                backoff_base_s=0.01, backoff_max_s=0.05, qps=1000, burst=1000, request_timeout_s=10)
    base.update(kw)
    return KubernetesConfig(**base)


@pytest.fixture
def emulator():
    with Emulator() as emu:
        yield emu


@pytest.fixture
def kubelet(emulator) -> FakeKubelet:
    return FakeKubelet(emulator.url, NS, emulator)


@pytest.fixture
def backend_factory(emulator):
    made = []

    def make(**kw) -> KubernetesBackend:
        be = KubernetesBackend(config(**kw), host=emulator.url)
        made.append(be)
        return be

    yield make
    for be in made:
        be.close()


@pytest.fixture
def backend(backend_factory) -> KubernetesBackend:
    return backend_factory()


@pytest.fixture
def in_thread(emulator):
    """Play the kubelet concurrently with a blocking ``run_phase``; joined before the emulator stops."""
    threads: list[threading.Thread] = []

    def start(fn, *args, **kwargs) -> threading.Thread:
        t = threading.Thread(target=fn, args=args, kwargs=kwargs, daemon=True)
        t.start()
        threads.append(t)
        return t

    yield start
    for t in threads:
        t.join(timeout=10)
