"""The dashboards' data: frames built from the store's windowed aggregates (``Store.stats``) and the learner's
public functions (pass@k, rubrics). No SQL here: the store aggregates on its own database and returns small rows.

Rubrics that need whole trajectories (recovery, self-verification, format, efficiency) come from the same code as
``openforge analyze`` (:func:`learner.rubric_summary`), run on a sample of rollouts, never on the full store.
"""

from __future__ import annotations

from collections.abc import Collection

import pandas as pd

from forge_store import RolloutInfo, Store, Window
from learner import RubricConfig, pass_at_k, pass_hat_k, rubric_summary, wilson_interval

SIDES = {"policy version": "policy_version_id", "harness": "harness_id"}
RUBRICS = ("rollouts", "shell_share", "format_ok_rate", "recovery_rate", "self_verification_rate",
           "inspect_first_rate", "made_up_name_rate", "tool_coverage", "step_efficiency")
PAGE_COLUMNS = ["id", "task_id", "harness_id", "policy_version_id", "outcome", "started_at", "ended_at", "reward",
                "calls"]


# ---- overview ------------------------------------------------------------------------------------------------
def overview(store: Store, window: Window) -> dict[str, pd.DataFrame]:
    """Success rate by policy version per day, outcome counts, latency percentiles, exclusions by reason."""
    stats = store.stats
    by_day = pd.DataFrame(stats.success_by_day(window), columns=["policy_version_id", "day", "rollouts", "successes"])
    if not by_day.empty:
        by_day["success_rate"] = by_day["successes"] / by_day["rollouts"]
    return {"by_day": by_day,
            "outcomes": pd.DataFrame(stats.outcomes(window), columns=["policy_version_id", "outcome", "rollouts"]),
            "latency": pd.DataFrame(stats.latency(window), columns=["policy_version_id", "rollouts", "p50_s", "p95_s"]),
            "exclusions": pd.DataFrame(stats.exclusions(window), columns=["reason", "rollouts"])}


PURPOSES = {"eval": "evaluation", "train": "training", "teacher": "teacher"}  # rollout purpose -> the chart's line
CHAIN_COLUMNS = ["position", "policy_version_id", "parent", "purpose", "rollouts", "graded", "successes",
                 "success_rate", "ci_low", "ci_high"]


def chain_order(versions: list[dict]) -> list[dict]:
    """Policy versions (``Store.lineage("policy_versions")`` rows, in creation order) along their lineage chain:
    every version after its parent (``metadata["parent"]``, as the learner records it), depth first; versions
    without a known parent, and the children of one version, by global step, then in creation order."""
    created = {v["id"]: i for i, v in enumerate(versions)}

    def key(v: dict) -> tuple:
        return v.get("global_step") is None, v.get("global_step") or 0, created[v["id"]]

    children: dict[str, list[dict]] = {}
    roots = []
    for v in versions:
        parent = (v.get("metadata") or {}).get("parent")
        if parent in created and parent != v["id"]:
            children.setdefault(parent, []).append(v)
        else:
            roots.append(v)
    out: list[dict] = []
    seen: set[str] = set()
    stack = sorted(roots, key=key, reverse=True)
    while stack:
        v = stack.pop()
        if v["id"] not in seen:
            seen.add(v["id"])
            out.append(v)
            stack.extend(sorted(children.get(v["id"], []), key=key, reverse=True))
    return out + sorted((v for v in versions if v["id"] not in seen), key=key)  # a parent loop: by step, creation


def success_along_chain(store: Store, window: Window) -> pd.DataFrame:
    """Success rate (successes over graded rollouts, with its Wilson 95% interval) per policy version and purpose,
    the versions in chain order (``position``); versions the store has no row for come last."""
    order = chain_order(store.lineage("policy_versions"))
    position = {v["id"]: i for i, v in enumerate(order)}
    parent = {v["id"]: (v.get("metadata") or {}).get("parent") for v in order}
    rows = [{**r, "policy_version_id": r["policy_version_id"] or "(none)"}
            for r in store.stats.success_by_version(window)]
    unknown = sorted({r["policy_version_id"] for r in rows} - set(position))
    position.update({v: len(order) + i for i, v in enumerate(unknown)})
    out = []
    for r in rows:
        version = r["policy_version_id"]
        lo, hi = wilson_interval(r["successes"], r["graded"]) or (None, None)
        out.append({**r, "policy_version_id": version, "position": position[version], "parent": parent.get(version),
                    "purpose": PURPOSES.get(r["purpose"], r["purpose"]),
                    "success_rate": r["successes"] / r["graded"] if r["graded"] else None, "ci_low": lo, "ci_high": hi})
    df = pd.DataFrame(out, columns=CHAIN_COLUMNS)
    return df.sort_values(["position", "purpose"], ignore_index=True)


# ---- trajectory browser --------------------------------------------------------------------------------------
def rollout_page(store: Store, window: Window, filters: dict[str, str | None], *, page: int = 0, page_size: int = 50,
                 reward_sources: Collection[str] | None = None) -> tuple[pd.DataFrame, int]:
    """One page of rollouts (newest first) matching ``filters`` (column -> value), with reward and call count,
    and the total count."""
    rows, total = store.stats.rollout_page(window, filters, page=page, page_size=page_size,
                                           reward_sources=reward_sources)
    return pd.DataFrame(rows, columns=PAGE_COLUMNS), total


# ---- behaviour -----------------------------------------------------------------------------------------------
def tool_distribution(store: Store, rollout_ids: list[str], config: RubricConfig | None = None) -> pd.DataFrame:
    """Tool calls per tool name (with category and share) over the given rollouts, counted by the store."""
    config = config or RubricConfig()
    df = pd.DataFrame(store.stats.tool_counts(rollout_ids), columns=["tool", "calls"])
    if df.empty:
        return pd.DataFrame(columns=["tool", "category", "calls", "share"])
    df["category"] = [config.category(t) for t in df["tool"]]
    df["share"] = df["calls"] / df["calls"].sum()
    return df[["tool", "category", "calls", "share"]]


def pass_rates(store: Store, window: Window, side: str, value: str, ks: tuple[int, ...] = (1, 5),
               config: RubricConfig | None = None,
               reward_sources: Collection[str] | None = None) -> dict[str, float | None]:
    """Success rate, mean pass@k and pass^k over tasks for one slice; counts per task come from the store."""
    config = config or RubricConfig()
    per_task = [(r["n"], r["c"]) for r in store.stats.task_pass_counts(
        window, side, value, pass_threshold=config.pass_threshold, graded_outcomes=config.graded_outcomes,
        reward_sources=reward_sources)]
    n_all = sum(n for n, _ in per_task)
    out: dict[str, float | None] = {"graded": n_all,
                                    "success_rate": sum(c for _, c in per_task) / n_all if n_all else None}
    for k in ks:
        at = [pass_at_k(n, c, k) for n, c in per_task if n >= k]
        hat = [pass_hat_k(n, c, k) for n, c in per_task if n >= k]
        out[f"pass@{k}"] = sum(at) / len(at) if at else None
        out[f"pass^{k}"] = sum(hat) / len(hat) if hat else None
    return out


def rubric_sample(store: Store, rollouts: list[RolloutInfo], config: RubricConfig | None = None,
                  reward_sources: Collection[str] | None = None) -> dict[str, float | None]:
    """The rubrics ``openforge analyze`` reports, over a sample of whole trajectories."""
    summary = rubric_summary(store, rollouts, config=config, reward_sources=reward_sources)
    return {k: summary[k] for k in RUBRICS}


# ---- exports -------------------------------------------------------------------------------------------------
def exports(store: Store, limit: int = 100) -> pd.DataFrame:
    return pd.DataFrame(store.stats.exports(limit), columns=["id", "format", "created_at", "watermark", "query",
                                                             "out_dir", "counts", "manifest"])
