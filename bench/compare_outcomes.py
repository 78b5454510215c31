"""Two learning-curve runs' versions compared task by task, across runs: what a change of the loop (the
demonstrations, the recipe) did to one role's policy on the same held-out tasks.

``bench/learning_curve.py`` compares versions within one run (SFT -> final, final - ``sft_extended``). Two runs of
the same seeds with the same held-out counts evaluate the same held-out tasks (a task is a pure function of family,
seed and difficulty), so a version of one run can be paired by task with a version of the other: for example the SFT
of even demonstrations against the SFT of demonstrations weighted toward the multi-step ``check`` and ``recover``
tasks. Reads each seed's ``outcomes.json`` (what ``bench/results/`` keeps); pooled over the seeds both runs have,
stratified by seed, as ``learning_curve.py`` pools.

Usage: python bench/compare_outcomes.py A_DIR[:ROLE] B_DIR[:ROLE] [--sampled] [--all] [--boot N]
A_DIR and B_DIR hold seed folders (``seed0/outcomes.json``, ...); ROLE is base, sft, final or sft_extended
(default: sft). Prints B - A for success (with McNemar's p where each task has one greedy rollout), success by family
and difficulty and, with --all, every rubric; the LAST line is JSON: ``{"a": ..., "b": ..., "seeds": [...],
"diffs": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from openforge.loop_report import ROLES  # noqa: E402  (ROOT first on the path)


def load(spec: str, sampled: bool) -> tuple[str, dict[int, dict]]:
    """``DIR[:ROLE]`` -> (label, seed -> task key -> TaskAgg of that role)."""
    from learner import TaskAgg

    folder, _, role = spec.partition(":")
    role = role or "sft"
    if role not in ROLES:
        raise SystemExit(f"{spec}: role {role!r} is not one of {', '.join(ROLES)}; pass e.g. {folder}:final")
    mode = "sampled" if sampled else "greedy"
    out: dict[int, dict] = {}
    for path in sorted(Path(folder).glob("seed*/outcomes.json")):
        raw = json.loads(path.read_text())
        part = (raw.get(mode) or {}).get(role)
        if part:
            out[int(raw["seed"])] = {k: TaskAgg.from_dict(v) for k, v in part.items()}
    if not out:
        raise SystemExit(f"{spec}: no seed*/outcomes.json under {folder} holds {mode} outcomes of {role}; "
                         f"run bench/learning_curve.py --keep {folder} first (with -- --eval-samples K for --sampled)")
    return f"{folder}:{role}", out


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from learner import compare_tasks, print_comparison

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--sampled", action="store_true", help="the sampled evaluations (-- --eval-samples K)")
    ap.add_argument("--all", action="store_true", help="every rubric, not only success")
    ap.add_argument("--boot", type=int, default=2000, help="bootstrap resamples")
    args = ap.parse_args(argv)
    (label_a, a), (label_b, b) = load(args.a, args.sampled), load(args.b, args.sampled)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise SystemExit(f"no seed in both: {label_a} has {sorted(a)}, {label_b} has {sorted(b)}")
    pa = {k: v for s in seeds for k, v in a[s].items()}
    pb = {k: v for s in seeds for k, v in b[s].items()}
    common = set(pa) & set(pb)
    if not common:
        raise SystemExit(f"{label_a} and {label_b} share no held-out task on seeds {seeds}: were they run with the "
                         "same --heldout-tasks and families?")
    diffs = compare_tasks(pa, pb, n_boot=args.boot, stratum=lambda key: key.split(":", 1)[0])
    shown = [d for d in diffs if args.all or d.metric.startswith("success")]
    console = Console(width=160) if not sys.stdout.isatty() else Console()
    print_comparison(console, f"{label_b} against {label_a}, {len(common)} held-out tasks paired, seeds "
                     f"{', '.join(map(str, seeds))} ({'sampled' if args.sampled else 'greedy'})", shown, "A", "B")
    print(json.dumps({"a": label_a, "b": label_b, "seeds": seeds, "sampled": args.sampled, "tasks": len(common),
                      "diffs": [d.as_dict() for d in shown]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
