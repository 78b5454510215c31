"""Where SFT stops rising: held-out success after each epoch of SFT on the teacher's demonstrations.

The learning loop trains SFT for ``--sft-epochs`` epochs before GRPO; the comparison GRPO must win is against the
best SFT the same demonstrations can buy, so that number of epochs has to be past the point where more SFT stops
helping. This bench measures it on a *validation* generation (seed 100 by default: none of ``bench/learning_curve.py``'s
seeds 0-2, so the choice is not fitted to the tasks the loop reports on): the loop's families and task counts,
the scripted teacher's demonstrations through the proxy, then one epoch of SFT at a time (one AdamW throughout,
each epoch a new shuffle), each epoch's version switched into the running engine and evaluated greedily on the
held-out tasks. Every version and evaluation is recorded in the store like the loop's.

Prints one line per epoch (success with its Wilson interval, the paired difference to the previous epoch and to the
best so far), then as its LAST line one JSON object: ``epochs`` (per epoch: success, successes, n, seconds of
training), ``best_epoch``, ``plateau_epoch`` (the first epoch whose success no later epoch beats by more than
``--tolerance`` tasks) and ``minutes``.

Usage: python bench/sft_plateau.py [--epochs 6] [--seed 100] [--demo-tasks 48] [--heldout-tasks 48] [--eval-from N]
                                   [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--demo-tasks", type=int, default=48)
    ap.add_argument("--heldout-tasks", type=int, default=48)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--train-layers", type=int, default=0, help="SFT trains only the last K decoder blocks (0: all)")
    ap.add_argument("--tolerance", type=int, default=1, help="tasks: a later epoch must beat a plateau by more")
    ap.add_argument("--eval-from", type=int, default=1, help="evaluate only epochs N and later (each evaluation "
                    "costs its minutes; e.g. to keep a checkpoint for bench/grpo_sweep.py without the curve)")
    ap.add_argument("--keep", type=Path)
    args = ap.parse_args(argv)
    home = args.keep or Path(tempfile.mkdtemp(prefix="openforge-sft-plateau-"))
    os.environ["OPENFORGE_HOME"] = str(home)
    try:
        doc = run(args, home)
    finally:
        if args.keep is None:
            shutil.rmtree(home, ignore_errors=True)
    print(json.dumps(doc))
    return 0


def run(args, home: Path) -> dict:
    from rich.console import Console

    from learner import ExportConfig, export, version_tasks
    from openforge.loop import LearningLoop, LoopConfig
    from openforge.loop_recipe import GrpoRecipe
    from openforge.loop_session import BASE_POLICY, Session

    console = Console(stderr=True, width=160)
    started = time.monotonic()
    cfg = LoopConfig(out=home / "demo", seed=args.seed, train_tasks=args.demo_tasks, demo_tasks=args.demo_tasks,
                     heldout_tasks=args.heldout_tasks, recipe=GrpoRecipe(rounds=0), port=0)
    loop = LearningLoop(cfg, console)
    _, demos, heldout = loop.tasks()
    epochs, previous = [], None
    with ExitStack() as stack:
        s = loop.session = Session(cfg, console, stack, loop.report)
        s.start()
        teacher_run = s.demonstrations(demos).run_id
        shard = cfg.out / "shards" / f"sft-{teacher_run}"
        export(s.store, shard, ExportConfig(format="sft", where=f"run_id = '{teacher_run}'"))
        parent, state = BASE_POLICY, cfg.out / "optimizer.pt"
        for e in range(1, args.epochs + 1):
            version = f"sft-epoch{e}"
            res = s.train(shard, version, parent=parent, algorithm="sft", lr=args.lr, epochs=1, seed=e,
                          optimizer_state=state, train_layers=args.train_layers or None)
            s.switch(res)
            loop.add_version(version, parent, f"sft epoch {e}")
            parent = version
            if e < args.eval_from:
                console.print(f"epoch {e}: not evaluated (--eval-from {args.eval_from})  "
                              f"({res.step.get('train_seconds')} s of training)")
                continue
            rate = loop.evaluate(version, heldout)
            tasks = version_tasks(s.store, version, purpose="eval", run_ids=[loop.report.eval_runs[version]])
            epochs.append({"epoch": e, "version": version, "success": rate.value, "successes": rate.successes,
                           "n": rate.n, "ci95": list(rate.interval()), "train_seconds": res.step.get("train_seconds"),
                           "per_task": {t: a.passed for t, a in sorted(tasks.items())}})
            _say(console, epochs, previous)
            previous = tasks
    best = max(epochs, key=lambda x: (x["successes"], -x["epoch"]))
    plateau = next(x for x in epochs if all(y["successes"] <= x["successes"] + args.tolerance
                                            for y in epochs if y["epoch"] > x["epoch"]))
    return {"seed": args.seed, "demo_tasks": args.demo_tasks, "heldout_tasks": args.heldout_tasks,
            "train_layers": args.train_layers,
            "epochs": [{k: v for k, v in x.items() if k != "per_task"} for x in epochs],
            "best_epoch": best["epoch"], "plateau_epoch": plateau["epoch"],
            "minutes": round((time.monotonic() - started) / 60, 2)}


def _say(console, epochs: list[dict], previous) -> None:
    x = epochs[-1]
    line = f"epoch {x['epoch']}: {x['successes']}/{x['n']} [{x['ci95'][0]:.2f}, {x['ci95'][1]:.2f}]"
    if previous is not None:
        won = sum(1 for t, p in x["per_task"].items() if p and not previous.get(t, None) is None
                  and not previous[t].passed)
        lost = sum(1 for t, p in x["per_task"].items() if not p and t in previous and previous[t].passed)
        line += f"  vs epoch {epochs[-2]['epoch']}: +{won} -{lost} tasks"
    console.print(f"[bold]{line}[/]  ({x['train_seconds']} s of training)")


if __name__ == "__main__":
    sys.exit(main())
