"""The per-task outcomes of a learning-curve seed that stopped before it printed its result, read from its store.

``bench/learning_curve.py`` writes a seed's ``outcomes.json`` from its store once the loop has printed its result
(``demo-result.json`` names each role's version and evaluation runs). A seed stopped earlier (for example before its
control) has evaluations in its store but no result: this finds each named version's greedy and sampled evaluation
runs by their names (``eval VERSION (tag)``, ``eval sampled VERSION (tag)``, as the loop names them) and writes the
same ``outcomes.json``, which ``bench/compare_kept.py`` reads. It refuses a version with no evaluation run or with
more than one.

Usage: python bench/outcomes_from_store.py SEED_DIR OUT_SEED_DIR ROLE=VERSION [ROLE=VERSION ...]
e.g.   python bench/outcomes_from_store.py /tmp/runs/seed0 bench/results/X/seed0 base=smollm2-135m-instruct \\
           sft=smollm2-12071144-sft final=smollm2-12071144-grpo2
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("learning_curve", Path(__file__).with_name("learning_curve.py"))
curve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(curve)


def eval_runs(home: Path, versions: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Version -> its greedy evaluation run, and version -> its sampled one (empty where none ran)."""
    from forge_store import Settings, open_store

    with open_store(f"sqlite:///{home / 'store.sqlite'}", settings=Settings(home=home)) as store:
        runs = [(run["name"] or "", run["id"]) for run in store.lineage("runs")]
    greedy, sampled = {}, {}
    for role, version in versions.items():
        for kind, out in (("eval", greedy), ("eval sampled", sampled)):
            found = [rid for name, rid in runs if name.startswith(f"{kind} {version} (")]
            if len(found) > 1:
                raise SystemExit(f"{role}={version}: {len(found)} runs named '{kind} {version} (...)' in {home}; "
                                 "one loop evaluates a version once")
            out.update({version: rid for rid in found})
        if version not in greedy:
            evaluated = sorted({name.removeprefix("eval ").split(" (")[0] for name, _ in runs
                                if name.startswith("eval ") and not name.startswith("eval sampled ")})
            raise SystemExit(f"{role}={version}: no run named 'eval {version} (...)' in {home}; the versions "
                             f"evaluated there are {', '.join(evaluated)}")
    return greedy, sampled


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or not all("=" in a for a in args[2:]):
        raise SystemExit(__doc__.split("\n\n")[-1])
    home, out = Path(args[0]), Path(args[1])
    if not home.name.removeprefix("seed").isdigit() or not (home / "store.sqlite").exists():
        raise SystemExit(f"{home}: not a seed folder with a store (seedN/store.sqlite, as bench/learning_curve.py "
                         "--keep DIR leaves them)")
    versions = dict(a.split("=", 1) for a in args[2:])
    seed = int(home.name.removeprefix("seed"))
    greedy_runs, sampled_runs = eval_runs(home, versions)
    doc = {"roles": versions}
    greedy = curve.aggregates(seed, home, doc, greedy_runs)
    sampled = curve.aggregates(seed, home, doc, sampled_runs) if sampled_runs else None
    out.mkdir(parents=True, exist_ok=True)
    curve.write_outcomes(out / curve.OUTCOMES, seed, greedy, sampled)
    for role, tasks in greedy.items():
        line = f"{role:<13} greedy {sum(a.passed for a in tasks.values())}/{sum(a.n for a in tasks.values())}"
        if sampled and role in sampled:
            line += f"  sampled {sum(a.passed for a in sampled[role].values())}/" \
                    f"{sum(a.n for a in sampled[role].values())}"
        print(line)
    print(f"wrote {out / curve.OUTCOMES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
