"""GRPO recipes side by side from one SFT version, on a validation generation: which recipe moves held-out success?

``bench/learning_curve.py`` pays for base evaluation, demonstrations and SFT on every run; tuning the GRPO recipe
there costs 20-30 minutes a try. This bench starts from a folder ``bench/sft_plateau.py --keep DIR`` left (its
store, its SFT versions ``sft-epochN`` and their held-out evaluations on seed 100), serves the chosen epoch's
checkpoint, and for each recipe: switches the engine back to that SFT version, runs the recipe's GRPO rounds on the
train split of another generation (``--pool-seed``, 101 by default: new task instances no demonstration showed, as the
loop's undemonstrated train tasks), evaluates the last version greedily on the same held-out tasks as the SFT
version, and compares the two paired by task (``learner.compare_tasks``: success and every rubric, 95% bootstrap
intervals). Seeds 100 and 101 are none of ``bench/learning_curve.py``'s (0-2), so a recipe chosen here is not fitted
to the tasks the loop reports on.

Usage: python bench/grpo_sweep.py --from DIR (--epoch N | --sft VERSION --seed S) [--pool-seed 101] [--pool-tasks 48]
       [--loop-pool N] [--eval-samples K] [--eval-rounds] [--careful P --max-turns T] --recipe "temperature=0.8,negative_weight=0" [--recipe ...]
From a ``bench/learning_curve.py --keep DIR --keep-checkpoints`` seed folder (``--from DIR/seedS --sft VERSION --seed
S``), ``--loop-pool N`` draws the rounds' tasks as that loop did (its own N train tasks, the undemonstrated ones
first) instead of another generation's, and ``--eval-samples K`` adds the loop's sampled evaluation (K rollouts a
held-out task at the recipe's temperature), compared with the SFT version's own sampled run (read from the folder's
``demo-result.json``): so a recipe costs its rounds and one evaluation, not another SFT.
With ``--pool-tasks`` equal to the recipe's ``tasks_per_round`` every round draws the same tasks: whether the rounds
raise success on what they train on (``train`` in a recipe's row) is the check that the update climbs its reward at
all, before asking it to generalise.
A recipe is ``GrpoRecipe`` fields (``openforge/loop_recipe.py``) as ``name=value`` pairs. Prints one line per recipe,
then as its LAST line one JSON object: ``sft`` (version, success) and ``recipes`` (per recipe: its fields, the final
version, success, final_minus_sft with its interval and McNemar p, the rubrics whose interval excludes 0, minutes,
and with ``--eval-rounds`` a ``curve``: every earlier round's version, success and difference to SFT).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_recipe(text: str):
    from openforge.loop_recipe import GrpoRecipe

    fields = {f.name: f for f in dataclasses.fields(GrpoRecipe)}
    kw = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in fields:
            raise SystemExit(f"--recipe {text!r}: unknown field {name!r}; the fields are {', '.join(fields)}")
        kind = type(getattr(GrpoRecipe(), name))
        kw[name] = (value.lower() in ("1", "true", "yes")) if kind is bool else (
            None if value == "none" else (kind(value) if kind in (int, float, str) else float(value)))
    recipe = GrpoRecipe(**kw)
    recipe.check()
    return recipe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="home", type=Path, required=True, help="a folder bench/sft_plateau.py --keep left")
    ap.add_argument("--epoch", type=int, help="the SFT epoch every recipe starts from (sft-epochN)")
    ap.add_argument("--sft", help="or the version every recipe starts from, a checkpoint under DIR/checkpoints (e.g. "
                    "the SFT version of a `bench/learning_curve.py --keep DIR --keep-checkpoints` seed folder, with "
                    "--seed that seed)")
    ap.add_argument("--sft-run", help="with --sft: the run of its greedy held-out evaluation (default: the one DIR's "
                    "demo-result.json names; without either every evaluation of the version counts, sampled ones "
                    "too)")
    ap.add_argument("--seed", type=int, default=100, help="the generation sft_plateau evaluated on")
    ap.add_argument("--pool-seed", type=int, default=101)
    ap.add_argument("--pool-tasks", type=int, default=48)
    ap.add_argument("--heldout-tasks", type=int, default=48)
    ap.add_argument("--loop-pool", type=int, default=0, metavar="N", help="draw from the loop's own pool of seed "
                    "--seed (N train tasks, 48 of them demonstrated; undemonstrated first) instead of --pool-seed's")
    ap.add_argument("--eval-samples", type=int, default=0, metavar="K", help="also evaluate K rollouts a held-out "
                    "task at the recipe's temperature, against the SFT version's sampled run in DIR/demo-result.json")
    ap.add_argument("--careful", type=float, default=0.0, help="the loop's --careful: the share of careful steps its "
                    "tasks' reference solutions were generated with (the tasks themselves do not change with it)")
    ap.add_argument("--max-turns", type=int, default=5, help="the loop's --max-turns (turns a rollout may take)")
    ap.add_argument("--recipe", action="append", required=True)
    ap.add_argument("--n-boot", type=int, default=4000)
    ap.add_argument("--eval-rounds", action="store_true", help="evaluate every round's version on the held-out "
                    "tasks, not only the last (a curve per recipe; each evaluation costs its minutes)")
    args = ap.parse_args(argv)
    if (args.epoch is None) == (args.sft is None):
        ap.error("pass --epoch N (a bench/sft_plateau.py folder's sft-epochN) or --sft VERSION, one of them")
    if args.eval_samples == 1 or args.eval_samples < 0:
        ap.error(f"--eval-samples {args.eval_samples}: pass 0 (greedy only) or 2 or more rollouts a task")
    if args.loop_pool and args.loop_pool <= 48:
        ap.error(f"--loop-pool {args.loop_pool}: the loop's train tasks include its 48 demonstrated ones; pass the "
                 "--train-tasks the loop ran with (96 by default)")
    recipes = [parse_recipe(r) for r in args.recipe]
    os.environ["OPENFORGE_HOME"] = str(args.home)
    doc = run(args, recipes)
    print(json.dumps(doc))
    return 0


def run(args, recipes) -> dict:
    from rich.console import Console

    from learner import TrainResult, version_tasks
    from openforge.loop import LearningLoop, LoopConfig
    from openforge.loop_tasks import grpo_pool
    from openforge.loop_sampling import RoundSampler
    from openforge.loop_session import Session

    console = Console(stderr=True, width=160)
    home, sft = args.home, args.sft or f"sft-epoch{args.epoch}"
    checkpoint = home / "checkpoints" / sft
    if not checkpoint.is_dir():
        raise SystemExit(f"--epoch {args.epoch} / --sft {args.sft}: no checkpoint {checkpoint}; run "
                         f"bench/sft_plateau.py --keep {home} --epochs N first, or name a version under "
                         f"{home / 'checkpoints'}")
    demos = sorted((home / "demo" / "shards").glob("sft-*"))   # the demonstrations' export (a recipe's sft_anchor)
    if not demos and (anchored := [i for i, r in enumerate(recipes, 1) if r.sft_anchor]):
        raise SystemExit(f"--recipe {', '.join(map(str, anchored))}: sft_anchor > 0 (the default) trains on the "
                         f"demonstrations' SFT export, and {home / 'demo' / 'shards'} holds none (sft-*); export "
                         f"it from the folder's store: OPENFORGE_HOME={home} openforge export --format sft --where "
                         f"\"purpose = 'teacher'\" --out {home / 'demo' / 'shards' / 'sft-teacher'} (bench/"
                         "learning_curve.py --keep-checkpoints keeps it since 2026-12-06), or add sft_anchor=0")
    # the sweep's own folder for its tasks, round shards and optimizer state: the loop's (DIR/demo) may hold a task
    # generation with another train count, which a generation of the same seed may not overwrite
    base_cfg = LoopConfig(out=home / "sweep", seed=args.seed, train_tasks=args.loop_pool or args.heldout_tasks,
                          demo_tasks=48 if args.loop_pool else args.heldout_tasks, heldout_tasks=args.heldout_tasks,
                          port=0, control=False, eval_samples=args.eval_samples, careful=args.careful,
                          max_turns=args.max_turns)
    train, demo_tasks, heldout = LearningLoop(base_cfg, console).tasks()
    if args.loop_pool:   # the loop's own order: the undemonstrated train tasks first
        pool = grpo_pool(train, demo_tasks)
    else:
        pool_cfg = dataclasses.replace(base_cfg, seed=args.pool_seed, train_tasks=args.pool_tasks, demo_tasks=4,
                                       heldout_tasks=4)
        pool, _, _ = LearningLoop(pool_cfg, console).tasks()
    sft_greedy, sft_sampled = _sft_runs(home, sft, args.sft_run, args.eval_samples)
    out = {"sft": {"version": sft}, "recipes": []}
    with ExitStack() as stack:
        holder = LearningLoop(base_cfg, console)
        s = Session(base_cfg, console, stack, holder.report)
        s.start()
        sft_tasks = version_tasks(s.store, sft, purpose="eval", run_ids=[sft_greedy] if sft_greedy else None)
        if not sft_tasks:
            raise SystemExit(f"{sft} has no evaluation in {home}'s store")
        out["sft"]["success"] = sum(a.passed for a in sft_tasks.values()) / sum(a.n for a in sft_tasks.values())
        sft_sampled_tasks = version_tasks(s.store, sft, purpose="eval", run_ids=[sft_sampled]) if sft_sampled else None
        if sft_sampled_tasks is not None:
            out["sft"]["sampled_success"] = (sum(a.passed for a in sft_sampled_tasks.values())
                                             / sum(a.n for a in sft_sampled_tasks.values()))
        for i, recipe in enumerate(recipes):
            t0 = time.monotonic()
            cfg = dataclasses.replace(base_cfg, recipe=recipe, tag=f"sweep{int(time.time())}-{i}")
            loop = LearningLoop(cfg, console)
            loop.session, loop.sft_shard = s, (demos[0] if demos else None)
            s.cfg, s.report = cfg, loop.report
            s.switch(TrainResult(sft, None, checkpoint, {}))
            loop.add_version(sft, None, "sft")
            current, curve, loop.sampler = sft, [], RoundSampler(pool, recipe)
            for r in range(1, recipe.rounds + 1):
                current = loop.grpo_round(r, current)
                if args.eval_rounds and r < recipe.rounds and current != sft:
                    success, moved = _versus(s, loop, current, heldout, sft_tasks, args.n_boot)
                    curve.append({"round": r, "version": current, "success": success.b, "final_minus_sft":
                                  success.diff, "ci95": list(success.ci95) if success.ci95 else None})
                    console.print(f"  round {r}: {current} {success.b:.3f}, diff {success.diff:+.3f} "
                                  f"{curve[-1]['ci95']}; moved: {', '.join(m['metric'] for m in moved) or 'nothing'}")
            if current == sft:
                out["recipes"].append({"recipe": recipe.as_dict(), "final": None, "notes": loop.report.notes,
                                       "train": _train_curve(loop)})
                continue
            success, moved = _versus(s, loop, current, heldout, sft_tasks, args.n_boot)
            sampled = _sampled_versus(s, loop, current, sft_sampled_tasks, args.n_boot)
            row = {"recipe": recipe.as_dict(), "final": current, "success": success.b, "curve": curve,
                   "final_minus_sft": success.diff, "ci95": list(success.ci95) if success.ci95 else None,
                   "p": success.p_value, "ratios": loop.report.ratios, "moved": moved,
                   "minutes": round((time.monotonic() - t0) / 60, 2), "notes": loop.report.notes,
                   "train": _train_curve(loop), "draws": loop.report.draws, **({"sampled": sampled} if sampled else {})}
            out["recipes"].append(row)
            console.print(f"[bold]recipe {i}[/] {args.recipe[i]}: {sft} {success.a:.3f} -> {current} {success.b:.3f}, "
                          f"diff {success.diff:+.3f} {row['ci95']} p {success.p_value}; moved: "
                          f"{', '.join(m['metric'] for m in moved) or 'nothing'} ({row['minutes']} min)")
            if sampled:
                console.print(f"  sampled: {sampled['sft']:.3f} -> {sampled['success']:.3f}, diff "
                              f"{sampled['final_minus_sft']:+.3f} {sampled['ci95']}; moved: "
                              f"{', '.join(m['metric'] for m in sampled['moved']) or 'nothing'}")
            print(json.dumps(row), flush=True)
    return out


def _train_curve(loop) -> list[dict]:
    """Each version's success on the rollouts the rounds sampled from it (the rounds' own tasks, at the recipe's
    temperature): with ``--pool-tasks`` equal to a round's tasks every round samples the same tasks, so this is the
    policy's success on what it trains on, round by round."""
    return [{"version": row.version, "successes": row.train.successes, "n": row.train.n}
            for row in loop.report.rows if row.train.n]


def _sft_runs(home: Path, sft: str, greedy: str | None, sampled: bool) -> tuple[str | None, str | None]:
    """The SFT version's greedy evaluation run (``--sft-run``, else the one a learning-curve seed folder's
    ``demo-result.json`` names, else None: every evaluation of the version counts) and, with ``sampled``, its
    sampled one (the file's ``sampled.runs``; required)."""
    path = home / "demo-result.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    greedy = greedy or (doc.get("eval_runs") or {}).get(sft)
    if not sampled:
        return greedy, None
    run = ((doc.get("sampled") or {}).get("runs") or {}).get(sft)
    if not run:
        raise SystemExit(f"--eval-samples: {path} names no sampled evaluation run of {sft}; start from a "
                         "bench/learning_curve.py seed folder run with `-- --eval-samples K`, or leave --eval-samples out")
    return greedy, run


def _compared(s, sft_tasks, version: str, run: str, n_boot: int):
    """``version``'s evaluation ``run`` against the SFT version's, paired by task: (the success difference, the
    rubrics whose interval excludes 0)."""
    from learner import compare_tasks, version_tasks

    diffs = compare_tasks(sft_tasks, version_tasks(s.store, version, purpose="eval", run_ids=[run]), n_boot=n_boot)
    success = next(d for d in diffs if d.metric == "success_rate")
    return success, [d.as_dict() for d in diffs if d.ci95 and (d.ci95[0] > 0 or d.ci95[1] < 0)]


def _sampled_versus(s, loop, version: str, sft_tasks, n_boot: int) -> dict | None:
    """The sampled evaluation ``loop.evaluate`` ran for ``version``, compared with SFT's, paired by task."""
    run = loop.report.sampled_runs.get(version)
    if not run or sft_tasks is None:
        return None
    success, moved = _compared(s, sft_tasks, version, run, n_boot)
    return {"run": run, "sft": success.a, "success": success.b, "final_minus_sft": success.diff,
            "ci95": list(success.ci95) if success.ci95 else None, "moved": moved}


def _versus(s, loop, version: str, heldout, sft_tasks, n_boot: int):
    """Evaluate ``version`` on the held-out tasks (greedy, and sampled with ``--eval-samples``) and compare the
    greedy run with the SFT version's, paired by task."""
    loop.evaluate(version, heldout)
    return _compared(s, sft_tasks, version, loop.report.eval_runs[version], n_boot)


if __name__ == "__main__":
    sys.exit(main())
