"""Learning curve: does a policy get better from data that went through the store, on this CPU, and how fast?

Runs the learning loop (``openforge demo``: base evaluation, scripted-teacher demonstrations through the proxy, SFT,
GRPO rounds, each policy version evaluated on held-out generated tasks, every switch done in place behind the
proxy's fence) in a fresh ``OPENFORGE_HOME`` under a temporary folder, with the loop's progress on stderr.

Prints a table, then as its LAST line one JSON object with:
  success_base, success_sft, success_final: held-out success rate of the base, the SFT version and the last version
  final_minus_base, final_minus_sft (+ _ci95): the differences with Newcombe's 95% interval
  rounds: GRPO rounds that updated the policy; minutes: wall time of the whole loop (vLLM start included)
  switch_s_p50: median time of a policy switch (pause, drain, in-place weight load, activate, resume)
  importance_ratio_mean: mean over GRPO updates of the trainer's / the engine's probability of the sampled tokens on
    the first batch after each switch (1.0 = the trainer sees exactly what the engine sampled from)
Targets (issue 19): final - base >= 0.4; importance ratio in [0.99, 1.01]; switch p50 <= 15 s; minutes <= 30.

Usage: python bench/learning_curve.py [--rounds 2] [--train-tasks 48] [--heldout-tasks 24] [--seed 0] [--keep DIR]
       [--grpo-lr 2e-5] [--grpo-epochs 1] [--grpo-batch-size N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--train-tasks", type=int, default=48)
    ap.add_argument("--heldout-tasks", type=int, default=24)
    ap.add_argument("--tasks-per-round", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grpo-lr", type=float, default=2e-5)
    ap.add_argument("--grpo-epochs", type=int, default=1)
    ap.add_argument("--grpo-batch-size", type=int, default=0, help="0: the whole round's shard in one update")
    ap.add_argument("--port", type=int, default=0, help="vLLM's port (default: a free one)")
    ap.add_argument("--keep", type=Path, help="keep the store, shards and checkpoints in this folder")
    args = ap.parse_args(argv)
    home = args.keep or Path(tempfile.mkdtemp(prefix="openforge-curve-"))
    home.mkdir(parents=True, exist_ok=True)
    cmd = [str(Path(sys.executable).parent / "openforge"), "demo", "--rounds", str(args.rounds),
           "--train-tasks", str(args.train_tasks), "--heldout-tasks", str(args.heldout_tasks),
           "--tasks-per-round", str(args.tasks_per_round), "--group-size", str(args.group_size),
           "--seed", str(args.seed), "--port", str(args.port), "--grpo-lr", str(args.grpo_lr),
           "--grpo-epochs", str(args.grpo_epochs)] + (["--grpo-batch-size", str(args.grpo_batch_size)]
                                                     if args.grpo_batch_size else [])
    env = {**os.environ, "OPENFORGE_HOME": str(home)}
    print(f"running {' '.join(cmd[1:])} with OPENFORGE_HOME={home}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    finally:
        if args.keep is None:
            shutil.rmtree(home, ignore_errors=True)
    if proc.returncode != 0:
        print(f"the loop failed (exit {proc.returncode}); its log is above", file=sys.stderr)
        return proc.returncode
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    _table(doc)
    keys = ("success_base", "success_sft", "success_final", "final_minus_base", "final_minus_base_ci95",
            "final_minus_sft", "final_minus_sft_ci95", "rounds", "minutes", "switch_s_p50", "importance_ratio_mean",
            "phases_s")
    print(json.dumps({k: doc.get(k) for k in keys}))
    return 0


def _table(doc: dict) -> None:
    print(f"{'version':<34} {'made by':<14} {'held-out success [95% CI]':<28} {'samples':>8}")
    for v in doc["versions"]:
        h = v["heldout"]
        rate = "-" if h["rate"] is None else f"{h['rate']:.2f} [{h['ci95'][0]:.2f}, {h['ci95'][1]:.2f}] n={h['n']}"
        print(f"{v['version']:<34} {v['made_by']:<14} {rate:<28} {v['samples'] if v['samples'] is not None else '-':>8}")
    targets = [("final - base >= 0.4", doc.get("final_minus_base"), lambda x: x >= 0.4),
               ("importance ratio in [0.99, 1.01]", doc.get("importance_ratio_mean"), lambda x: 0.99 <= x <= 1.01),
               ("switch p50 <= 15 s", doc.get("switch_s_p50"), lambda x: x <= 15),
               ("minutes <= 30", doc.get("minutes"), lambda x: x <= 30)]
    for name, value, ok in targets:
        verdict = "no figure" if value is None else ("met" if ok(value) else "NOT met")
        print(f"target {name:<34} {value!s:<10} {verdict}")


if __name__ == "__main__":
    sys.exit(main())
