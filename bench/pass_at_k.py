"""How much can GRPO sharpen a version? pass@k on the held-out tasks for k up to K, from K sampled rollouts a task.

GRPO turns rollouts the policy already samples into the ones it prefers: without new behaviour, the most a round can
buy on a task is its pass@k for the k it can tell apart. So pass@K of the SFT version, against its pass@1 (sampled),
bounds what sharpening alone can add to sampled success; a target above that bound asks the rounds to find solutions
the SFT policy does not sample. (Yue et al. 2025 measure RL with verifiable rewards raising pass@1 and lowering pass@k
for large k: a policy narrowed onto what it already solved.)

Starts from a ``bench/learning_curve.py --keep DIR --keep-checkpoints`` seed folder (``--from DIR/seedS``), serves
each named version's checkpoint in turn, runs K rollouts a held-out task at the recipe's temperature (one run per
version, ``purpose`` eval, recorded in the folder's store like every other evaluation), and prints pass@k (the
unbiased estimator, ``learner.pass_at_k``) and pass^k for k = 1, 2, 4, ... K, by family too.

Usage: python bench/pass_at_k.py --from DIR/seedS --seed S --version V [--version V2] [--k 16] [--temperature 1.0]
                                 [--max-turns 5]
Prints a table per version, then as its LAST line one JSON object: ``versions`` (per version: its run, ``pass_at``
and ``pass_hat`` by k, ``by_family``) and ``tasks``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def ks(top: int) -> list[int]:
    """1, 2, 4, ... up to ``top``, and ``top`` itself."""
    out, k = [], 1
    while k < top:
        out.append(k)
        k *= 2
    return out + [top]


def curves(tasks: dict, top: int) -> dict:
    """pass@k and pass^k (mean over tasks) for k in ``ks(top)``, overall and by family, from task -> (n, passed,
    family)."""
    from learner import pass_at_k, pass_hat_k

    def mean(rows, fn, k):
        vals = [fn(n, c, k) for n, c, _ in rows]
        vals = [v for v in vals if v is not None]
        return sum(vals) / len(vals) if vals else None

    rows = list(tasks.values())
    fams = defaultdict(list)
    for r in rows:
        fams[r[2]].append(r)
    return {"pass_at": {k: mean(rows, pass_at_k, k) for k in ks(top)},
            "pass_hat": {k: mean(rows, pass_hat_k, k) for k in ks(top)},
            "by_family": {f: {"pass_at_1": mean(rs, pass_at_k, 1), f"pass_at_{top}": mean(rs, pass_at_k, top)}
                          for f, rs in sorted(fams.items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="home", type=Path, required=True, help="a bench/learning_curve.py seed folder")
    ap.add_argument("--seed", type=int, required=True, help="the seed that folder ran (its held-out tasks)")
    ap.add_argument("--version", action="append", required=True, help="a version with a checkpoint under "
                    "DIR/checkpoints (repeat for several)")
    ap.add_argument("--k", type=int, default=16, help="rollouts a held-out task (the largest k)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--heldout-tasks", type=int, default=48)
    ap.add_argument("--max-turns", type=int, default=5, help="the loop's --max-turns (turns a rollout may take)")
    args = ap.parse_args(argv)
    if args.k < 2:
        ap.error(f"--k {args.k}: pass@k needs 2 or more rollouts a task")
    for v in args.version:
        if not (args.home / "checkpoints" / v / "config.json").is_file():
            ap.error(f"--version {v}: no checkpoint {args.home / 'checkpoints' / v}; name a version the folder kept "
                     "(bench/learning_curve.py --keep-checkpoints)")
    os.environ["OPENFORGE_HOME"] = str(args.home)
    print(json.dumps(run(args)))
    return 0


def run(args) -> dict:
    from rich.console import Console

    from learner import TrainResult, version_tasks
    from openforge.loop import LearningLoop, LoopConfig
    from openforge.loop_session import Session

    console = Console(stderr=True, width=160)
    # its own task folder: the loop's (DIR/demo/tasks) holds a generation with its own train count, which another
    # generation of the same seed may not overwrite; the held-out tasks are the same bytes either way
    cfg = LoopConfig(out=args.home / "pass-at-k", seed=args.seed, train_tasks=args.heldout_tasks,
                     demo_tasks=args.heldout_tasks, heldout_tasks=args.heldout_tasks, port=0, control=False,
                     max_turns=args.max_turns)
    holder = LearningLoop(cfg, console)
    _, _, heldout = holder.tasks()
    out = {"k": args.k, "temperature": args.temperature, "versions": {}}
    with ExitStack() as stack:
        s = Session(cfg, console, stack, holder.report)
        s.start()
        for v in args.version:
            s.switch(TrainResult(v, None, args.home / "checkpoints" / v, {}))
            summary = s.rollouts(heldout, purpose="eval", group_size=args.k, temperature=args.temperature,
                                 name=f"pass@{args.k} {v}")
            aggs = version_tasks(s.store, v, purpose="eval", run_ids=[summary.run_id])
            tasks = {t: (a.n, a.passed, a.family) for t, a in aggs.items()}
            doc = {"run": summary.run_id, **curves(tasks, args.k)}
            out["versions"][v] = doc
            console.print(f"[bold]{v}[/] ({summary.run_id}, {len(tasks)} tasks x {args.k}):")
            console.print("  k        " + "  ".join(f"{k:>6}" for k in doc["pass_at"]))
            for name in ("pass_at", "pass_hat"):
                console.print(f"  {name:<8} " + "  ".join(f"{x:6.3f}" if x is not None else "     -"
                                                          for x in doc[name].values()))
            for fam, row in doc["by_family"].items():
                console.print(f"  {fam:<8} pass@1 {row['pass_at_1']:.3f}  pass@{args.k} {row[f'pass_at_{args.k}']:.3f}")
    out["tasks"] = len(heldout)
    return out


if __name__ == "__main__":
    sys.exit(main())
