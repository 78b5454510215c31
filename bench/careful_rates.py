"""How often does a version look before it acts, and does looking pay? Read from a kept learning-curve seed's store.

With a careful teacher (``openforge demo --careful P``) the demonstrations look before acting on a share P of the
``check`` and ``recover`` steps (``tail -c 1 f | wc -l``; the natural command, its error, then the fix). SFT
imitates that share; GRPO can raise it where looking pays. This bench reads every named version's sampled held-out
evaluation (``--eval-samples K``) and prints, by family: success, the share of rollouts whose first tool call only
looks (the ``inspect_first_rate`` rubric of ``openforge analyze --compare``: no write, mv, cp, rm, mkdir...), success
with and without
that first look, the share of rollouts that met a tool error, and the share of failed calls the next call recovered
from (the ``error_recovery`` rubric). Then the paired difference (by task, bootstrap over tasks) of the look share
and of success between the first two versions.

Usage: python bench/careful_rates.py --from DIR/seedS [--version V ...] (default: the run's SFT and final versions;
a loop still running has no result yet: name the versions, their runs are found in the store by name)
Prints tables, then as its LAST line one JSON object: per version and family the rates, and ``look_delta`` /
``success_delta`` with their 95% intervals.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

def version_rows(store, run_id: str) -> dict[str, list[dict]]:
    """task id -> one row per rollout of the run: family, passed, looked first, failed calls, recovered."""
    from forge_store import RolloutFilter
    from learner import rollout_rubrics

    infos = [r for r in store.iter_rollouts(RolloutFilter(run_id=run_id)) if r.outcome is not None]
    calls = store.calls_by_rollout([r.id for r in infos])
    out = defaultdict(list)
    for r in infos:
        rubrics = rollout_rubrics(calls[r.id])   # the rubrics' own rules, as `openforge analyze --compare` has them
        out[r.task_id].append({"family": r.task_id.split("-")[0], "passed": r.outcome == "success",
                               "looked": rubrics.inspected_first, "failed": rubrics.failed,
                               "recovered": rubrics.recovered})
    return out


def family_rates(rows: dict[str, list[dict]]) -> dict[str, dict]:
    fams = defaultdict(list)
    for task_rows in rows.values():
        for x in task_rows:
            fams[x["family"]].append(x)
    out = {}
    for fam, xs in sorted(fams.items()):
        looked = [x for x in xs if x["looked"]]
        blind = [x for x in xs if x["looked"] is False]
        failed = sum(x["failed"] for x in xs)
        out[fam] = {"rollouts": len(xs), "success": _mean(x["passed"] for x in xs),
                    "looked_first": _mean(bool(x["looked"]) for x in xs),
                    "success_looked": _mean(x["passed"] for x in looked),
                    "success_blind": _mean(x["passed"] for x in blind),
                    "met_error": _mean(x["failed"] > 0 for x in xs),
                    "recovered": sum(x["recovered"] for x in xs) / failed if failed else None}
    return out


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def paired(a: dict, b: dict, field: str, families: tuple[str, ...], n_boot: int) -> dict:
    """B - A of the mean per-task share of ``field`` over the tasks of ``families``, paired by task."""
    from learner._compare import bootstrap

    def per_task(rows):
        return {t: _mean(bool(x[field]) for x in xs) for t, xs in rows.items() if t.split("-")[0] in families}

    metric = lambda vals: _mean(vals) if vals else None  # noqa: E731
    va, vb, ci, _ = bootstrap(per_task(a), per_task(b), metric, n_boot=n_boot)
    return {"a": va, "b": vb, "delta": None if va is None or vb is None else vb - va,
            "ci95": list(ci) if ci else None, "families": list(families)}


def sampled_runs(store, result: Path) -> dict:
    """version -> its sampled evaluation run: from the loop's demo-result.json (plus ``roles``), or, for a loop still
    running, from the store's runs named ``eval sampled VERSION (TAG)`` (the last of each version)."""
    if result.is_file():
        doc = json.loads(result.read_text())
        return {**((doc.get("sampled") or {}).get("runs") or {}), "roles": doc["roles"]}
    named = re.compile(r"^eval sampled (\S+) \(")
    found = {m.group(1): r["id"] for r in store.lineage("runs") if (m := named.match(r.get("name") or ""))}
    return {**found, "roles": {}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="home", type=Path, required=True, help="a bench/learning_curve.py seed folder")
    ap.add_argument("--version", action="append", help="versions to read (default: the run's SFT and final)")
    ap.add_argument("--n-boot", type=int, default=2000)
    args = ap.parse_args(argv)
    result, db = args.home / "demo-result.json", args.home / "store.sqlite"
    if not result.is_file() and not (args.version and db.is_file()):
        ap.error(f"--from {args.home}: no demo-result.json (and no store.sqlite, or no --version to look for in it); "
                 "pass a seed folder bench/learning_curve.py --keep wrote, or --version V for a run still going")
    from forge_store import open_store

    with open_store(f"sqlite:///{db}") as store:
        runs = sampled_runs(store, result)
        versions = args.version or [runs["roles"]["sft"], runs["roles"]["final"]]
        missing = [v for v in versions if v not in runs]
        if missing:
            ap.error(f"--version {', '.join(missing)}: no sampled evaluation run of it; the sampled runs are "
                     f"{', '.join(v for v in runs if v != 'roles') or 'none (run the loop with --eval-samples K)'}")
        rows = {v: version_rows(store, runs[v]) for v in versions}
    out = {"versions": {v: family_rates(r) for v, r in rows.items()}}
    for v, fams in out["versions"].items():
        print(f"{v} (run {runs[v]})")
        print(f"  {'family':<8} {'n':>4} {'success':>8} {'looks':>6} {'ok|look':>8} {'ok|blind':>8} {'error':>6} "
              f"{'recov':>6}")
        for fam, x in fams.items():
            cells = [x[k] for k in ("success", "looked_first", "success_looked", "success_blind", "met_error",
                                    "recovered")]
            print(f"  {fam:<8} {x['rollouts']:>4} " + " ".join(f"{c:>8.3f}" if c is not None else f"{'-':>8}"
                                                            for c in cells))
    if len(versions) >= 2:
        a, b = rows[versions[0]], rows[versions[1]]
        for name, field in (("look_delta", "looked"), ("success_delta", "passed")):
            for fams in (("check",), ("recover",), ("check", "recover"), ("files", "check", "recover", "plan")):
                d = paired(a, b, field, fams, args.n_boot)
                out.setdefault(name, {})["+".join(fams)] = d
                ci = f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]" if d["ci95"] else "(no interval)"
                if d["delta"] is not None:
                    print(f"{name} {'+'.join(fams):<26} {d['a']:.3f} -> {d['b']:.3f}  {d['delta']:+.3f} {ci}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
