"""The orchestrator on the Kubernetes backend (emulated API server, a fake kubelet that plays each pod through its
phases): the same interface as the local sandbox, a group of rollouts graded, the pod's node, image digest and
events in the store, every object deleted."""

from __future__ import annotations

import threading
import time

from forge_store import Settings, open_store
from openforge.embedded_proxy import EmbeddedProxy
from rollout import AdminClient
from rollout._backends.kubernetes import KubernetesBackend
from rollout._harnesses import get_harness
from rollout._orchestrator import Orchestrator, RunConfig
from rollout._task import load_task
from tests.rollout_fixtures import EXAMPLES

from .conftest import config

REWARD = "/logs/verifier/reward.json"


def _auto_kubelet(kubelet, emulator, stop: threading.Event, rewards: list[float]) -> None:
    """Play every new pod: scheduled, image pulled, seed, harness (exit 0), verifier (the next reward)."""
    seen = set()
    while not stop.is_set():
        for pod in emulator.objects("pods"):
            name = pod["metadata"]["name"]
            if name in seen:
                continue
            seen.add(name)
            reward = rewards[(len(seen) - 1) % len(rewards)]
            kubelet.schedule(name, node="node-a")
            kubelet.start(name, "seed")
            kubelet.finish(name, "seed", exit_code=0)
            kubelet.start(name, "p-harness")
            kubelet.finish(name, "p-harness", wrapped_exit=0, log="harness done\n")
            kubelet.start(name, "p-verifier", phase="Running")
            kubelet.finish(name, "p-verifier", wrapped_exit=0, phase="Succeeded",
                           outputs={REWARD: f'{{"reward": {reward}}}'.encode()})
        time.sleep(0.05)


def test_a_group_on_the_kubernetes_backend(up, tmp_path, emulator, kubelet):
    settings = Settings(home=tmp_path / "home")
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}", journal=True, name="run",
                       settings=settings.model_copy(update={"journal_fsync": False}))
    proxy = EmbeddedProxy(up.url, store=store, settings=settings, socket_path=tmp_path / "proxy.sock")
    admin = AdminClient(proxy.url, proxy.admin_token)
    backend = KubernetesBackend(config(), host=emulator.url)
    stop = threading.Event()
    t = threading.Thread(target=_auto_kubelet, args=(kubelet, emulator, stop, [1.0, 0.0]), daemon=True)
    t.start()
    try:
        cfg = RunConfig(harness="react", model="mock-model", group_size=2, concurrency=2)
        summary = Orchestrator(cfg, store=store, backend=backend, harness=get_harness("react"), admin=admin).run(
            [load_task(EXAMPLES / "files-config-to-json")])
        assert store.flush(30)
        assert sorted(r.outcome for r in summary.results) == ["failure", "success"], \
            [(r.outcome, r.detail) for r in summary.results]
        for res in summary.results:
            ro = store.rollout(res.rollout_id)
            assert ro.backend == "kubernetes" and ro.node_name == "node-a" and ro.pod_name
            assert ro.image_ref == "python:3.11-slim" and ro.image_digest.startswith("sha256:")
            kinds = [e.kind for e in store.events(ro.id)]
            assert "pod.Scheduled" in kinds and "pod.Started" in kinds and "verifier.finished" in kinds, kinds
        assert emulator.objects("pods") == [] and emulator.objects("secrets") == []
    finally:
        stop.set()
        t.join(5)
        backend.close()
        admin.close()
        proxy.stop()
        store.close()
