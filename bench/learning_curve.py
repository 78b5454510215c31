"""Learning curve: does GRPO teach beyond imitation on this CPU, over several seeds, and how sure are we?

Runs the learning loop (``openforge demo``: base evaluation, scripted-teacher demonstrations through the proxy, SFT,
GRPO rounds, the final version evaluated, and the control ``sft_extended``: SFT continued on the same
demonstrations for as many seconds as the GRPO rounds took) once per seed, each in a fresh ``OPENFORGE_HOME`` under
a temporary folder, with the loop's progress on stderr. Each seed generates its own tasks (families ``files``,
``check``, ``recover``, ``plan``), so the seeds are independent replications.

Every comparison is **paired by held-out task** (a bootstrap over tasks; pooled: stratified by seed, so each seed
keeps its weight), read back from each seed's store: ``learner.compare_tasks``, what ``openforge analyze
--compare`` prints.

Prints a table per seed and pooled, the targets, then as its LAST line one JSON object: ``{"seeds": [...],
"pooled": {...}, "targets": {...}}`` where each seed and the pool have
  success_base, success_sft, success_final, success_sft_extended: held-out success rates
  final_minus_sft, final_minus_sft_extended, final_minus_base (+ _ci95, paired)
  heldout_tasks, minutes (per seed: wall time of the whole loop, vLLM start included), grpo_minutes
  importance_ratio_mean (trainer / engine probability of the sampled tokens, first mini-batch of each update; its
  expectation is 1 whatever the mismatch, so it cannot show one), importance_k3_mean (the k3 estimate of
  KL(engine || trainer) over the same tokens: 0 when they compute the same distribution),
  sft_curve and sft_epochs (staged SFT, ``-- --sft-stage-epochs N``: validation success after each stage, and the
  epochs of the stage chosen as the SFT version),
  switch_s_p50, rubrics (SFT -> final: every rubric's two values, difference and paired interval)
  machine (each seed: the machine its loop ran on, ``bench/machine.py``; None for seeds kept before it was recorded;
  at the top level: the machine that pooled them)
  sampled (pooled, with ``-- --eval-samples K``): the same successes, differences and rubrics over K rollouts a
  held-out task sampled at the GRPO temperature (each seed's own figures are in its ``sampled``)
Targets (issue 36): pooled final - SFT >= 0.15 with the interval's lower end above 0; pooled final - SFT extended
> 0; pooled final - base >= 0.5; minutes <= 30 per seed; importance ratio in [0.99, 1.01]; a rubric other than
success whose interval excludes 0.

SFT runs ``SFT_PLATEAU_EPOCHS`` epochs unless the demo options name ``--sft-epochs`` or ``--sft-stage-epochs``.

Usage: python bench/learning_curve.py [--seeds 3] [--first-seed 0 | --seed N ...] [--keep DIR [--keep-checkpoints]]
                                     [-- DEMO OPTIONS ...]
With --keep DIR each seed's store and result stay there, and a second run over the same folder reads finished seeds
back instead of re-running them (so seeds can be run one at a time and pooled at the end; ``--seed 0 --seed 2``
picks seeds that are not consecutive). A finished seed's ``demo-result.json`` and ``outcomes.json`` (its per-task
aggregates, rewritten whenever its store is read) are enough to pool it without the store: ``bench/results/`` keeps
the measured seeds that way.
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
sys.path.insert(0, str(ROOT))
from bench.machine import describe, training_note  # noqa: E402
from openforge.loop_report import PAIRS, ROLES  # noqa: E402  (ROOT first on the path)
# SFT's length unless the options say otherwise: where held-out success stops rising on these demonstrations.
# Greedy success alone put it at 5 epochs (bench/sft_plateau.py, seed 100, lr 1e-4, 2026-12-03: 8, 11, 15, 13, 23, 19,
# 24, 21, 23 of 48 after epochs 1-9). Sampled success (the policy GRPO trains) keeps rising past that. On seed 1
# (README, 2026-12-06) 20 epochs beat 5 by +0.188 [+0.078, +0.302] sampled, paired by task; 26 more epochs (the
# control) then moved nothing (-0.005 [-0.047, +0.031] sampled, 0 greedy). The demo's own default (3 epochs) is short
# of both and would hand GRPO a weakened baseline.
SFT_PLATEAU_EPOCHS = 20
OUTCOMES = "outcomes.json"   # a seed's per-task aggregates, beside its demo-result.json


def run_seed(seed: int, home: Path, demo_args: list[str]) -> dict:
    done = home / "demo-result.json"
    if done.exists():   # a kept seed that already finished (--keep DIR, run again): read back, not re-run
        print(f"seed {seed}: reusing the finished loop in {home}", file=sys.stderr, flush=True)
        return json.loads(done.read_text())
    cmd = [str(Path(sys.executable).parent / "openforge"), "demo", "--seed", str(seed), "--port", "0", *demo_args]
    env = {**os.environ, "OPENFORGE_HOME": str(home), "COLUMNS": os.environ.get("COLUMNS", "160")}
    print(f"seed {seed}: running {' '.join(cmd[1:])} with OPENFORGE_HOME={home}", file=sys.stderr, flush=True)
    machine = describe()
    if note := training_note(machine):
        print(f"seed {seed}: note: {note}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed}: the loop failed (exit {proc.returncode}); its log is above")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    doc["machine"] = machine   # kept with the seed: seeds pooled later may have run on other machines
    done.write_text(json.dumps(doc))
    return doc


def aggregates(seed: int, home: Path, doc: dict, runs: dict | None = None) -> dict[str, dict]:
    """Role -> 's<seed>:<task>' -> the task's rubric aggregate, from this seed's store (``runs``: version -> run,
    the greedy evaluations by default)."""
    from forge_store import Settings, open_store
    from learner import version_tasks

    out: dict[str, dict] = {}
    runs = doc["eval_runs"] if runs is None else runs
    with open_store(f"sqlite:///{home / 'store.sqlite'}", settings=Settings(home=home)) as store:
        for role, version in doc["roles"].items():
            run = runs.get(version)
            if run:
                tasks = version_tasks(store, version, purpose="eval", run_ids=[run])
                out[role] = {f"s{seed}:{t}": agg for t, agg in tasks.items()}
    return out


def outcomes(seed: int, home: Path, doc: dict) -> tuple[dict[str, dict], dict[str, dict] | None]:
    """(greedy, sampled or None) per-task aggregates of this seed: read from its store, and written beside
    ``demo-result.json`` as ``OUTCOMES`` so that a seed whose store is gone (or was never copied: the two small files
    are what ``bench/results/`` keeps) still pools."""
    saved = home / OUTCOMES
    sampled_runs = (doc.get("sampled") or {}).get("runs")
    if not (home / "store.sqlite").exists():
        if not saved.exists():
            raise SystemExit(f"seed {seed}: {home} has demo-result.json but neither store.sqlite nor {OUTCOMES}: "
                             "the per-task outcomes cannot be pooled; remove demo-result.json there to re-run it")
        return saved_outcomes(saved)
    greedy = aggregates(seed, home, doc)
    sampled = aggregates(seed, home, doc, sampled_runs) if sampled_runs else None
    write_outcomes(saved, seed, greedy, sampled)
    return greedy, sampled


def write_outcomes(path: Path, seed: int, greedy: dict[str, dict], sampled: dict[str, dict] | None) -> None:
    """What :func:`saved_outcomes` reads back."""
    dump = lambda part: {role: {k: a.as_dict() for k, a in tasks.items()} for role, tasks in part.items()}  # noqa
    path.write_text(json.dumps({"seed": seed, "greedy": dump(greedy), "sampled": dump(sampled) if sampled else None}))


def saved_outcomes(path: Path) -> tuple[dict[str, dict], dict[str, dict] | None]:
    """(greedy, sampled or None) per-task aggregates read back from an ``OUTCOMES`` file."""
    from learner import TaskAgg

    raw = json.loads(path.read_text())
    load = lambda part: {role: {k: TaskAgg.from_dict(v) for k, v in tasks.items()}   # noqa: E731
                         for role, tasks in part.items()}
    return load(raw["greedy"]), (load(raw["sampled"]) if raw.get("sampled") else None)


def pooled(per_seed: list[tuple[int, dict, dict]], n_boot: int) -> dict:
    from learner import compare_tasks

    aggs: dict[str, dict] = {role: {} for role in ROLES}
    for _, _, a in per_seed:
        for role, tasks in a.items():
            aggs[role].update(tasks)
    stratum = lambda key: key.split(":", 1)[0]  # noqa: E731
    out: dict = {}
    for role in ROLES:
        n = sum(t.n for t in aggs[role].values())
        out[f"success_{role}"] = sum(t.passed for t in aggs[role].values()) / n if n else None
    for name, (a, b) in PAIRS.items():
        if aggs[a] and aggs[b]:
            d = next(x for x in compare_tasks(aggs[a], aggs[b], n_boot=n_boot, stratum=stratum)
                     if x.metric == "success_rate")
            out[name], out[f"{name}_ci95"], out[f"{name}_p"] = d.diff, list(d.ci95) if d.ci95 else None, d.p_value
        else:
            out[name], out[f"{name}_ci95"], out[f"{name}_p"] = None, None, None
    out["rubrics"] = ([d.as_dict() for d in compare_tasks(aggs["sft"], aggs["final"], n_boot=n_boot,
                                                          stratum=stratum)] if aggs["sft"] and aggs["final"] else [])
    # the control's figures pool only the seeds that ran it (`-- --no-control` runs none): how many of how many
    out["sft_extended_seeds"] = [sum(1 for _, _, a in per_seed if a.get("sft_extended")), len(per_seed)]
    docs = [d for _, d, _ in per_seed]
    out["heldout_tasks"] = sum(d.get("heldout_tasks") or 0 for d in docs)
    out["minutes"] = [d["minutes"] for d in docs]
    ratios = [d["importance_ratio_mean"] for d in docs if d.get("importance_ratio_mean") is not None]
    out["importance_ratio_mean"] = round(sum(ratios) / len(ratios), 5) if ratios else None
    k3s = [d["importance_k3_mean"] for d in docs if d.get("importance_k3_mean") is not None]
    out["importance_k3_mean"] = float(f"{sum(k3s) / len(k3s):.3e}") if k3s else None
    switches = sorted(d["switch_s_p50"] for d in docs if d.get("switch_s_p50") is not None)
    out["switch_s_p50"] = switches[len(switches) // 2] if switches else None
    return out


def seed_row(seed: int, doc: dict) -> dict:
    keys = [f"success_{r}" for r in ROLES] + [k for name in PAIRS for k in (name, f"{name}_ci95", f"{name}_p")]
    keys += ["heldout_tasks", "minutes", "grpo_minutes", "importance_ratio_mean", "importance_k3_mean", "switch_s_p50",
             "rounds", "phases_s", "recipe", "sft", "teacher", "notes", "sft_curve", "machine"]
    row = {"seed": seed, **{k: doc.get(k) for k in keys}, "rubrics": doc.get("rubrics_sft_to_final", [])}
    if doc.get("sampled"):
        row["sampled"] = {k: v for k, v in doc["sampled"].items() if k not in ("per_task", "runs")}
    chosen = next((c for c in doc.get("sft_curve") or [] if c["version"] == doc.get("roles", {}).get("sft")), None)
    row["sft_epochs"] = chosen["epochs"] if chosen else (doc.get("sft") or {}).get("epochs")
    return row


def targets(pool: dict) -> dict:
    def met(ok) -> str:
        return "no figure" if ok is None else ("met" if ok else "NOT met")

    fs, ci = pool.get("final_minus_sft"), pool.get("final_minus_sft_ci95")
    moved = [r["metric"] for r in pool.get("rubrics", []) if not r["metric"].startswith(("success", "pass"))
             and r["ci95"] and (r["ci95"][0] > 0 or r["ci95"][1] < 0)]
    ratio = pool.get("importance_ratio_mean")
    ran, seeds = pool.get("sft_extended_seeds") or (0, 0)
    control = f" (the control ran on {ran} of {seeds} seeds)" if 0 < ran < seeds else ""
    return {
        "final - SFT >= 0.15, CI lower end > 0": met(None if fs is None else fs >= 0.15 and bool(ci) and ci[0] > 0),
        "final - SFT extended > 0": met(None if pool.get("final_minus_sft_extended") is None
                                        else pool["final_minus_sft_extended"] > 0) + control,
        "final - base >= 0.5": met(None if pool.get("final_minus_base") is None else pool["final_minus_base"] >= 0.5),
        "minutes <= 30 per seed": met(None if not pool["minutes"] else max(pool["minutes"]) <= 30),
        "importance ratio in [0.99, 1.01]": met(None if ratio is None else 0.99 <= ratio <= 1.01),
        "a rubric besides success moves (CI excludes 0)": met(bool(moved)) + (f": {', '.join(moved)}" if moved else ""),
    }


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:+.3f}" if v < 0 else f"{v:.3f}"
    if isinstance(v, list) and len(v) == 2 and all(isinstance(x, float) for x in v):
        return f"[{v[0]:+.3f}, {v[1]:+.3f}]"
    return str(v)


def print_tables(rows: list[dict], pool: dict, goals: dict) -> None:
    cols = ["success_base", "success_sft", "success_final", "success_sft_extended", "final_minus_sft",
            "final_minus_sft_ci95", "final_minus_sft_extended", "final_minus_sft_extended_ci95", "final_minus_base",
            "heldout_tasks", "minutes", "importance_ratio_mean", "sft_epochs"]
    width = max(len(c) for c in cols) + 2
    print("".join(f"{h:<{width}}" for h in ["", *[f"seed {r['seed']}" for r in rows], "pooled"]))
    for c in cols:
        print("".join(f"{x:<{width}}" for x in [c, *[fmt(r.get(c)) for r in rows], fmt(pool.get(c))]))
    print("\nrubrics SFT -> final, pooled (paired by task, stratified by seed):")
    for r in pool.get("rubrics", []):
        print(f"  {r['metric']:<34} {fmt(r['a']):>8} -> {fmt(r['b']):>8}  diff {fmt(r['diff']):>8}  "
              f"CI {fmt(r['ci95'])}")
    sampled = pool.get("sampled")
    if sampled:
        print("\nsampled evaluation (--eval-samples: K rollouts a held-out task at the GRPO temperature), pooled:")
        for c in [c for c in cols if c in sampled]:
            print(f"  {c:<34} {fmt(sampled[c])}")
    for name, verdict in goals.items():
        print(f"target {name:<48} {verdict}")


def prune(home: Path, keep: set | None) -> None:
    """After a seed: the checkpoints, shards and optimizer states take gigabytes; the store holds the lineage. With
    ``keep`` (--keep-checkpoints: the SFT and final versions) those checkpoints stay, and so does the demonstrations'
    SFT export (kilobytes: bench/grpo_sweep.py's anchor)."""
    for folder in (home / "checkpoints").glob("*"):
        if keep is None or folder.name not in keep:
            shutil.rmtree(folder, ignore_errors=True)
    demo = home / "demo"
    for item in (demo.iterdir() if demo.is_dir() else []):
        if keep is not None and item.name == "shards":
            for shard in item.iterdir():
                if not shard.name.startswith("sft-"):
                    shutil.rmtree(shard, ignore_errors=True)
        else:
            shutil.rmtree(item, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, help="how many consecutive seeds (3 by default)")
    ap.add_argument("--first-seed", type=int, help="the first of them (0 by default)")
    ap.add_argument("--seed", type=int, action="append", dest="seed_list", metavar="N",
                    help="run these seeds (repeat it: --seed 0 --seed 2) instead of --seeds from --first-seed")
    ap.add_argument("--keep", type=Path, help="keep each seed's store and result under this folder; run again with "
                    "the same folder and more --seeds, a finished seed is read back, not re-run")
    ap.add_argument("--keep-checkpoints", action="store_true", help="with --keep: keep the SFT and final versions' "
                    "checkpoints (about 0.5 GB each) so the store can be re-scored (bench/rescore.py) or served later")
    ap.add_argument("--n-boot", type=int, default=4000)
    ap.add_argument("demo_args", nargs=argparse.REMAINDER, help="after --: options for openforge demo")
    args = ap.parse_args(argv)
    machine = describe()   # before the load: its load average is the neighbours'
    if args.keep_checkpoints and args.keep is None:
        ap.error("--keep-checkpoints keeps them in the --keep DIR: pass --keep DIR too")
    if args.seed_list and (args.seeds is not None or args.first_seed is not None):
        ap.error(f"--seed {' --seed '.join(map(str, args.seed_list))} names the seeds; --seeds / --first-seed pick "
                 "consecutive ones instead: pass one way or the other")
    first = args.first_seed or 0
    seeds = args.seed_list or range(first, first + (3 if args.seeds is None else args.seeds))
    demo_args = [a for a in args.demo_args if a != "--"]
    if not any(a.split("=")[0] in ("--sft-epochs", "--sft-stage-epochs") for a in demo_args):
        demo_args = ["--sft-epochs", str(SFT_PLATEAU_EPOCHS), *demo_args]
    root = args.keep or Path(tempfile.mkdtemp(prefix="openforge-curve-"))
    per_seed, sampled_seeds = [], []
    try:
        for seed in seeds:
            home = root / f"seed{seed}"
            home.mkdir(parents=True, exist_ok=True)
            doc = run_seed(seed, home, demo_args)
            greedy, sampled = outcomes(seed, home, doc)
            per_seed.append((seed, doc, greedy))
            if sampled:   # -- --eval-samples K: the sampled evaluation, pooled too
                sampled_seeds.append((seed, doc, sampled))
            print(f"seed {seed}: {json.dumps(seed_row(seed, doc))}", file=sys.stderr, flush=True)
            prune(home, {doc["roles"].get(r) for r in ("sft", "final")} if args.keep_checkpoints else None)
        pool = pooled(per_seed, args.n_boot)
        if sampled_seeds and len(sampled_seeds) == len(per_seed):
            sampled = pooled(sampled_seeds, args.n_boot)
            pool["sampled"] = {k: sampled[k] for k in sampled if k.startswith(("success_", "final_minus", "sft_ext"))
                               or k == "rubrics"}
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    rows = [seed_row(seed, doc) for seed, doc, _ in per_seed]
    goals = targets(pool)
    print_tables(rows, pool, goals)
    print(json.dumps({"seeds": rows, "pooled": pool, "targets": goals, "machine": machine}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
