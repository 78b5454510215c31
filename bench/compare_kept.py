"""Two versions from kept learning-curve seeds, compared paired by held-out task, also when they come from two runs.

``bench/learning_curve.py --keep DIR`` keeps each seed's ``demo-result.json`` and ``outcomes.json`` (the per-task
aggregates of every role: base, sft, final, sft_extended). Two runs of the same seed generate the same held-out
tasks, so a version of one run can be compared with a version of another task by task: for example the SFT of a run
that trained 20 epochs up front against the ``sft_extended`` of a run that trained 5 and then the control's minutes
(did the longer SFT buy what the control bought?), or two runs' SFT versions (how far apart is SFT run to run?).

A seed folder with ``outcomes.json`` and no ``demo-result.json`` (a run stopped before it printed its result, whose
evaluations were read from its store) compares too. Refuses two seeds whose task sets differ (other seeds, other task counts or families), naming the first task one
has and the other lacks: a pairing over different tasks would mean nothing.

Prints B - A for success (McNemar's exact p where every task has one rollout on both sides) and every rubric whose
interval excludes 0, then as its LAST line one JSON object: ``a``, ``b`` (what was compared), ``tasks``, and
``rubrics`` (each: metric, a, b, diff, ci95, p_value).

Usage: python bench/compare_kept.py SEED_DIR:ROLE SEED_DIR:ROLE [--sampled] [--n-boot 4000]
e.g.   python bench/compare_kept.py bench/results/learning-curve-2026-12-06/seed1:sft_extended \\
                                    bench/results/learning-curve-2026-12-06-sft20/seed1:sft
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("learning_curve", Path(__file__).with_name("learning_curve.py"))
curve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(curve)


def side(spec: str, sampled: bool) -> tuple[str, dict]:
    """``SEED_DIR:ROLE`` -> (its label, task -> aggregate)."""
    folder, sep, role = spec.rpartition(":")
    home = Path(folder)
    if not sep or not folder:
        raise SystemExit(f"{spec!r}: expected SEED_DIR:ROLE (e.g. bench/results/learning-curve-2026-12-06/seed1:sft)")
    if not home.name.removeprefix("seed").isdigit():
        raise SystemExit(f"{spec}: {home.name} is not a seed folder (seedN, as bench/learning_curve.py --keep DIR "
                         "names them)")
    if (home / "demo-result.json").exists():
        doc = json.loads((home / "demo-result.json").read_text())
        greedy, sampled_aggs = curve.outcomes(int(home.name.removeprefix("seed")), home, doc)
    elif (home / curve.OUTCOMES).exists():   # a run stopped before its result: what its evaluations recorded
        greedy, sampled_aggs = curve.saved_outcomes(home / curve.OUTCOMES)
    else:
        raise SystemExit(f"{spec}: {home} holds neither demo-result.json nor {curve.OUTCOMES}; pass a seed folder "
                         "that bench/learning_curve.py --keep DIR wrote (DIR/seedN)")
    aggs = sampled_aggs if sampled else greedy
    if aggs is None:
        raise SystemExit(f"{spec}: this seed ran no sampled evaluation (--eval-samples); drop --sampled")
    if role not in aggs:
        raise SystemExit(f"{spec}: no role {role!r} there; it has {', '.join(sorted(aggs))}")
    return f"{home}:{role}", aggs[role]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="SEED_DIR:ROLE, the baseline")
    ap.add_argument("b", help="SEED_DIR:ROLE, compared as B - A")
    ap.add_argument("--sampled", action="store_true", help="the sampled evaluations (--eval-samples K), not greedy")
    ap.add_argument("--n-boot", type=int, default=4000)
    args = ap.parse_args(argv)
    from learner import compare_tasks

    (la, a), (lb, b) = side(args.a, args.sampled), side(args.b, args.sampled)
    if set(a) != set(b):
        only = sorted(set(a) ^ set(b))[0]
        raise SystemExit(f"the two sides hold different tasks ({len(a)} and {len(b)}; {only} is in "
                         f"{'A' if only in a else 'B'} only): compare versions of the same seed and task counts")
    if clash := next((t for t in a if (a[t].family, a[t].difficulty) != (b[t].family, b[t].difficulty)), None):
        raise SystemExit(f"task {clash} is {a[clash].family}/{a[clash].difficulty} in A and "
                         f"{b[clash].family}/{b[clash].difficulty} in B: the runs generated different tasks")
    diffs = compare_tasks(a, b, n_boot=args.n_boot)
    print(f"A {la}\nB {lb}\n{len(a)} tasks, {'sampled' if args.sampled else 'greedy'}, paired by task (B - A)")
    for d in diffs:
        moved = d.ci95 and (d.ci95[0] > 0 or d.ci95[1] < 0)
        if d.metric == "success_rate" or moved:
            p = f"  p {d.p_value:.3f}" if d.p_value is not None else ""
            print(f"  {d.metric:<34} {curve.fmt(d.a):>8} -> {curve.fmt(d.b):>8}  diff {curve.fmt(d.diff):>8}  "
                  f"CI {curve.fmt(list(d.ci95) if d.ci95 else None)}{p}")
    print(json.dumps({"a": la, "b": lb, "tasks": len(a), "sampled": args.sampled,
                      "rubrics": [d.as_dict() for d in diffs]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
