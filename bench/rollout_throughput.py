"""Rollout throughput of the local (bubblewrap) backend on a trivial task, at concurrency 1, 4 and 16.

Each rollout is the full path: register with the embedded proxy, create the sandbox, run the reference `react`
harness (one model call to the scripted upstream, which answers at once), run the verifier, record reward and
events, destroy the sandbox. Baselines measured in the same run: a bare `bwrap ... true` and a bare
`python3 -c pass` process start, so the sandbox's own cost can be read against what any process start costs.

    python bench/rollout_throughput.py [--rollouts 48]

The last line is one JSON object: sandbox_start_ms_p50 (create() until sandbox_init answers; over all levels, and
per level: at c16 it is mostly waiting for a core), rollouts_per_s at c1 / c4 / c16, p50 rollout wall ms per level,
and the baselines.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402

from forge_store import Settings, open_store  # noqa: E402
from openforge.embedded_proxy import EmbeddedProxy
from proxy.engines.scripted import ScriptedUpstream, UpstreamServer  # noqa: E402
from proxy.engines.scripted.tokenizer import load_smollm2_tokenizer  # noqa: E402
from rollout import AdminClient  # noqa: E402
from rollout._backends.local import LocalBackend  # noqa: E402
from rollout._harnesses import get_harness  # noqa: E402
from rollout._orchestrator import Orchestrator, RunConfig  # noqa: E402
from rollout._task import load_task  # noqa: E402

TEST_SH = 'mkdir -p "$OPENFORGE_REWARD_DIR"; echo 1 > "$OPENFORGE_REWARD_DIR/reward.txt"\n'


def _trivial_task(root: Path) -> Path:
    d = root / "trivial"
    (d / "tests").mkdir(parents=True)
    (d / "task.toml").write_text("[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n")
    (d / "instruction.md").write_text("Say hello.")
    (d / "tests" / "test.sh").write_text(TEST_SH)
    for p in [d, *d.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return d


def _baseline_ms(argv: list[str], n: int = 20) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=48, help="rollouts per concurrency level")
    args = ap.parse_args()
    console = Console(stderr=True)
    work = Path(tempfile.mkdtemp(prefix="openforge-bench-", dir="/tmp"))
    os.chmod(work, 0o755)
    up = UpstreamServer(ScriptedUpstream(tokenizer=load_smollm2_tokenizer()))
    url = up.start()
    settings = Settings(home=work / "home")
    store = open_store(f"sqlite:///{work / 'store.sqlite'}", journal=True, name="bench",
                       settings=settings.model_copy(update={"journal_fsync": False}))
    proxy = EmbeddedProxy(url, store=store, settings=settings, socket_path=work / "proxy.sock")
    backend = LocalBackend(work / "sandboxes", proxy_socket=work / "proxy.sock")
    admin = AdminClient(proxy.url, proxy.admin_token)
    task = load_task(_trivial_task(work))
    harness = get_harness("react", max_turns=2)
    result: dict = {}
    starts: list[float] = []
    try:
        bwrap = shutil.which("bwrap")
        result["baseline_process_ms_p50"] = round(_baseline_ms([sys.executable, "-c", "pass"]), 2)
        result["baseline_bwrap_true_ms_p50"] = round(_baseline_ms(
            [bwrap, "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib",
             "--unshare-all", "--", "/usr/bin/true"]), 2)
        with Progress(console=console) as progress:
            bar = progress.add_task("rollouts", total=3 * args.rollouts)
            for c in (1, 4, 16):
                cfg = RunConfig(harness="react", model="mock-model", group_size=args.rollouts, concurrency=c,
                                max_infra_retries=0)
                orch = Orchestrator(cfg, store=store, backend=backend, harness=harness, admin=admin)
                t0 = time.perf_counter()
                summary = orch.run([task])
                wall = time.perf_counter() - t0
                progress.advance(bar, args.rollouts)
                bad = [r for r in summary.results if r.outcome != "success"]
                if bad:
                    raise SystemExit(f"c{c}: {len(bad)} rollouts did not succeed: {bad[0].outcome} {bad[0].detail}")
                level = [r.sandbox_start_ms for r in summary.results if r.sandbox_start_ms]
                starts += level
                result[f"sandbox_start_ms_p50_c{c}"] = round(statistics.median(level), 2)
                result[f"rollouts_per_s_c{c}"] = round(len(summary.results) / wall, 2)
                result[f"rollout_ms_p50_c{c}"] = round(statistics.median(r.duration_s for r in summary.results) * 1000, 1)
                console.print(f"c{c}: {result[f'rollouts_per_s_c{c}']} rollouts/s, "
                              f"p50 rollout {result[f'rollout_ms_p50_c{c}']} ms")
        result["sandbox_start_ms_p50"] = round(statistics.median(starts), 2)
        result["sandbox_start_ms_p95"] = round(sorted(starts)[int(0.95 * (len(starts) - 1))], 2)
        result["sandbox_start_vs_bwrap_true"] = round(result["sandbox_start_ms_p50"] /
                                                      result["baseline_bwrap_true_ms_p50"], 2)
        result["rollouts_per_level"] = args.rollouts
        result["cores"] = os.cpu_count()
    finally:
        admin.close()
        proxy.stop()
        store.close()
        up.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
