"""Kubernetes API load per rollout, measured against the emulator (kmock over loopback HTTP).

Runs N rollouts through the Kubernetes backend while a fake kubelet drives each pod (schedule, seed, a service
sidecar, harness, verifier), then counts the backend's API requests by verb (its counting wrapper; the emulator's
own request log cross-checks the creates) and the pod-watch events it consumed. Extrapolates to 1,000 concurrent
rollouts. Prints a JSON object as the last line. Never asserts times.
Usage: python bench/k8s_api_load.py [--rollouts 40] [--concurrency 8] [--duration-s 600] [--target 1000]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout._backends.base import Mount, Phase, SandboxSpec  # noqa: E402
from rollout._backends.kubernetes import KubernetesBackend, KubernetesConfig  # noqa: E402
from tests.doubles.k8s_emulator import Emulator, FakeKubelet  # noqa: E402

NS = "openforge-bench"
REWARD = "/logs/verifier/reward.json"


def task(root: Path) -> Path:
    (root / "environment" / "workspace").mkdir(parents=True)
    (root / "environment" / "workspace" / "main.py").write_text("print('hi')\n")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("echo '{\"reward\": 1}' > /logs/verifier/reward.json\n")
    return root


def spec(root: Path, i: int) -> SandboxSpec:
    return SandboxSpec(
        rollout_id=f"bench-{i:05d}", run_id="bench", group_id=f"g{i // 8}", task_id="t",
        workspace_seed=root / "environment" / "workspace", environment_dir=root / "environment",
        phases=(Phase("svc", ("python", "-m", "http.server", "9000"), background=True, ready_port=9000),
                Phase("harness", ("agent", "run"), env={"OPENAI_API_KEY": "tok"}),
                Phase("verifier", ("sh", "/tests/test.sh"), mounts=(Mount(root / "tests", "/tests"),),
                      outputs=(REWARD,))),
        image="ghcr.io/example/task:1", proxy_token="tok")


def drive(k: FakeKubelet, pod: str) -> None:
    """The status writes a kubelet makes for this pod shape (one write per container state change)."""
    k.schedule(pod)
    k.start(pod, "seed")
    k.finish(pod, "seed", exit_code=0)
    k.start(pod, "p-svc")
    k.start(pod, "p-harness")
    k.finish(pod, "p-harness", wrapped_exit=0, log="done\n")
    k.start(pod, "p-verifier", phase="Running")
    k.finish(pod, "p-verifier", wrapped_exit=0, outputs={REWARD: b'{"reward": 1}'}, phase="Succeeded")


def one(be: KubernetesBackend, k: FakeKubelet, root: Path, i: int) -> None:
    sb = be.create(spec(root, i))
    t = threading.Thread(target=drive, args=(k, sb.id), daemon=True)
    t.start()
    for phase in sb.spec.phases:
        be.run_phase(sb, phase)
    be.describe(sb)
    be.destroy(sb)
    t.join()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--duration-s", type=float, default=600.0, help="rollout duration assumed for the estimate")
    ap.add_argument("--target", type=int, default=1000, help="concurrent rollouts to estimate for")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Emulator() as emu:
        root = task(Path(tmp) / "task")
        cfg = KubernetesConfig(namespace=NS, qps=1000, burst=1000)
        be = KubernetesBackend(cfg, host=emu.url)
        k = FakeKubelet(emu.url, NS, emu)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(lambda i: one(be, k, root, i), range(args.rollouts)))
        wall = time.perf_counter() - t0
        counts = collections.Counter(be.api.counts)
        events = be.watcher.events_seen
        watches = be.watcher.watches_opened
        be.close()
    shared = {key: counts.pop(key) for key in ("list pods", "watch pods", "create networkpolicies") if key in counts}
    n = args.rollouts
    per = {key: round(v / n, 2) for key, v in sorted(counts.items())}
    by_verb: collections.Counter = collections.Counter()
    for key, v in counts.items():
        by_verb[key.split()[0]] += v / n
    per_total = sum(counts.values()) / n
    rps = args.target * per_total / args.duration_s
    creates = by_verb["create"]
    out = {
        "rollouts": n, "concurrency": args.concurrency, "wall_s": round(wall, 2),
        "per_rollout_requests": per, "per_rollout_by_verb": {k: round(v, 2) for k, v in sorted(by_verb.items())},
        "per_rollout_total": round(per_total, 2), "shared_requests": shared, "watches_opened": watches,
        "watch_events_per_rollout": round(events / n, 2),
        "emulator_cross_check_create_pods": emu.counts["create pods"],
        "estimate": {
            "concurrent_rollouts": args.target, "rollout_duration_s": args.duration_s,
            "requests_per_s": round(rps, 2), "open_watches": 1, "open_watches_if_one_per_pod": args.target,
            "watch_events_per_s": round(args.target * events / n / args.duration_s, 2),
            "startup_burst_s_at_default_qps": round(args.target * creates / KubernetesConfig().qps, 1),
        },
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
