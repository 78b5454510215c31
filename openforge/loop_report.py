"""What the learning loop ends with: paired comparisons of its versions on the held-out tasks, the rubric deltas
SFT -> final, and the JSON line ``bench/learning_curve.py`` reads.

Every difference is paired by task (``learner.compare_tasks``: a bootstrap over tasks, McNemar's exact test for
success), read back from the store's evaluation runs, not from the loop's counters: the numbers a user gets from
``openforge analyze --compare`` are the same ones.
"""

from __future__ import annotations

import statistics
import time

ROLES = ("base", "sft", "final", "sft_extended")


def roles(report) -> dict[str, str]:
    """Role -> policy version, for the versions the loop evaluated."""
    base, sft = report.made_by("base"), report.made_by("sft")
    control = report.made_by("sft extended (control)")
    evaluated = [r for r in report.rows if r.heldout.n and r.made_by != "sft extended (control)"]
    out = {"base": base.version if base else None, "sft": sft.version if sft else None,
           "final": evaluated[-1].version if evaluated else None,
           "sft_extended": control.version if control and control.heldout.n else None}
    return {k: v for k, v in out.items() if v}


def task_aggregates(store, report, runs: dict[str, str] | None = None) -> dict[str, dict]:
    """Role -> task id -> the rubric aggregate of that version's held-out evaluation (``runs``: version -> run,
    the greedy evaluation's by default)."""
    from learner import version_tasks

    runs = report.eval_runs if runs is None else runs
    return {role: version_tasks(store, v, purpose="eval", run_ids=[runs[v]])
            for role, v in roles(report).items() if v in runs}


def _pair(aggs: dict, a: str, b: str, n_boot: int) -> dict:
    from learner import compare_tasks

    if a not in aggs or b not in aggs:
        return {"diff": None, "ci95": None, "p_value": None}
    success = next(d for d in compare_tasks(aggs[a], aggs[b], n_boot=n_boot) if d.metric == "success_rate")
    return {"diff": success.diff, "ci95": list(success.ci95) if success.ci95 else None, "p_value": success.p_value}


PAIRS = {"final_minus_sft": ("sft", "final"), "final_minus_base": ("base", "final"),
         "final_minus_sft_extended": ("sft_extended", "final"), "sft_extended_minus_sft": ("sft", "sft_extended")}


def comparisons(report, aggs: dict, n_boot: int) -> dict:
    """Every pair's paired difference (``final_minus_sft``, ``_ci95``, ``_p``, ...), every rubric SFT -> final and
    each role's success per task, over one evaluation's task aggregates (greedy or sampled)."""
    from learner import compare_tasks

    doc: dict = {}
    for name, (a, b) in PAIRS.items():
        d = _pair(aggs, a, b, n_boot)
        doc[name], doc[f"{name}_ci95"], doc[f"{name}_p"] = d["diff"], d["ci95"], d["p_value"]
    moved = roles(report).get("final") != roles(report).get("sft")
    doc["rubrics_sft_to_final"] = ([d.as_dict() for d in compare_tasks(aggs["sft"], aggs["final"], n_boot=n_boot)]
                                   if moved and "sft" in aggs and "final" in aggs else [])
    doc["per_task"] = {role: {t: agg.passed / agg.n for t, agg in sorted(a.items())} for role, a in aggs.items()}
    return doc


def summary_json(report, started: float, store=None, recipe: dict | None = None, n_boot: int = 2000) -> dict:
    """The loop's last line: what ``bench/learning_curve.py`` reads and the issue's targets name."""
    aggs = task_aggregates(store, report) if store is not None else {}
    rates = {role: report.row(v).heldout.value for role, v in roles(report).items()}
    doc = {f"success_{role}": rates.get(role) for role in ROLES}
    doc["final_version"] = roles(report).get("final")
    doc.update(comparisons(report, aggs, n_boot))
    doc.update({
        "heldout_tasks": report.row(roles(report)["base"]).heldout.n if "base" in roles(report) else None,
        "rounds": report.rounds_trained, "minutes": round((time.monotonic() - started) / 60, 2),
        "grpo_minutes": round(report.grpo_seconds / 60, 2),
        "switch_s_p50": round(statistics.median(report.switches), 3) if report.switches else None,
        "importance_ratio_mean": round(statistics.fmean(report.ratios), 5) if report.ratios else None,
        "importance_k3_mean": float(f"{statistics.fmean(report.k3s):.3e}") if report.k3s else None,
        "phases_s": {k: round(v, 1) for k, v in report.phases.items()},
        "versions": [r.as_dict() for r in report.rows], "roles": roles(report), "eval_runs": report.eval_runs,
        "recipe": recipe, "notes": report.notes, "sft_curve": report.sft_curve, "draws": report.draws,
    })
    doc["sampled"] = sampled_json(report, store, recipe, n_boot) if store is not None else None
    return doc


def sampled_json(report, store, recipe: dict | None, n_boot: int) -> dict | None:
    """The same comparisons over the sampled held-out evaluation (``--eval-samples``): every version's success as
    the mean over its K rollouts a task at the GRPO temperature, differences paired by task (the bootstrap resamples
    tasks, each with its K rollouts); None when the loop ran none."""
    if not report.sampled_runs:
        return None
    aggs = task_aggregates(store, report, report.sampled_runs)
    doc = {"samples_per_task": max((a.n for agg in aggs.values() for a in agg.values()), default=0),
           "temperature": (recipe or {}).get("temperature"), "runs": report.sampled_runs}
    for role, agg in aggs.items():
        doc[f"success_{role}"] = sum(a.passed for a in agg.values()) / max(1, sum(a.n for a in agg.values()))
    doc.update(comparisons(report, aggs, n_boot))
    return doc


def print_final(console, doc: dict) -> None:
    """The paired differences the demo ends with, said plainly (an interval that includes 0 is said to)."""
    def line(name: str, label: str, src: dict = doc) -> None:
        d, ci, p = src.get(name), src.get(f"{name}_ci95"), src.get(f"{name}_p")
        if d is None:
            return
        verdict = ("[green]above 0: a difference the interval supports[/]" if ci and ci[0] > 0 else
                   "[red]below 0[/]" if ci and ci[1] < 0 else "[yellow]the interval includes 0: not shown to differ[/]")
        span = f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "(no interval)"
        test = "" if src is not doc else f"  McNemar p {p if p is None else round(p, 4)}"
        console.print(f"  {label:<26} {d:+.3f}  95% CI {span}{test}  {verdict}", highlight=False)

    console.print(f"[bold]paired by task[/] over {doc.get('heldout_tasks')} held-out tasks (bootstrap intervals):")
    if doc.get("roles", {}).get("final") == doc.get("roles", {}).get("sft"):
        console.print("  no GRPO round updated the policy (see the notes): the final version is the SFT version")
    else:
        line("final_minus_sft", "final - SFT")
        line("final_minus_sft_extended", "final - SFT extended")
    line("sft_extended_minus_sft", "SFT extended - SFT")
    line("final_minus_base", "final - base")
    sampled = doc.get("sampled")
    if sampled and doc.get("roles", {}).get("final") != doc.get("roles", {}).get("sft"):
        console.print(f"[bold]sampled[/]: {sampled['samples_per_task']} rollouts a held-out task at temperature "
                      f"{sampled['temperature']} (the policy GRPO trains), success per task averaged, paired by task:")
        line("final_minus_sft", "final - SFT (sampled)", sampled)
        line("final_minus_sft_extended", "final - SFT ext. (sampled)", sampled)
