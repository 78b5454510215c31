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
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("learning_curve", Path(__file__).with_name("learning_curve.py"))
curve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(curve)


def eval_runs(home: Path, versions: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Version -> its greedy evaluation run, and version -> its sampled one (empty where none ran)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(f"sqlite:///{home / 'store.sqlite'}")
    with engine.connect() as conn:
        names = dict(conn.execute(text("SELECT name, id FROM runs")).all())
    engine.dispose()
    greedy, sampled = {}, {}
    for role, version in versions.items():
        for kind, out in (("eval", greedy), ("eval sampled", sampled)):
            found = [rid for name, rid in names.items() if name.startswith(f"{kind} {version} (")]
            if len(found) > 1:
                raise SystemExit(f"{role}={version}: {len(found)} runs named '{kind} {version} (...)' in {home}; "
                                 "one loop evaluates a version once")
            if found:
                out[version] = found[0]
        if version not in greedy:
            raise SystemExit(f"{role}={version}: no run named 'eval {version} (...)' in {home}; the versions "
                             "evaluated there are " + ", ".join(sorted(n.split(" (")[0].removeprefix("eval ")
                                                                       for n in names if n.startswith("eval ")
                                                                       and not n.startswith("eval sampled"))))
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
    dump = lambda part: {role: {k: a.as_dict() for k, a in tasks.items()} for role, tasks in part.items()}  # noqa
    out.mkdir(parents=True, exist_ok=True)
    (out / curve.OUTCOMES).write_text(json.dumps({"seed": seed, "greedy": dump(greedy),
                                                  "sampled": dump(sampled) if sampled else None}))
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
