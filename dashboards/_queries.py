"""The dashboards' data: frames built from the store's windowed aggregates (``Store.stats``) and the learner's
public functions (pass@k, rubrics). No SQL here: the store aggregates on its own database and returns small rows.

Rubrics that need whole trajectories (recovery, self-verification, format, efficiency) come from the same code as
``openforge analyze`` (:func:`learner.rubric_summary`), run on a sample of rollouts, never on the full store.
"""

from __future__ import annotations

from collections.abc import Collection

import pandas as pd

from forge_store import RolloutInfo, Store, Window
from learner import RubricConfig, pass_at_k, pass_hat_k, rubric_summary

SIDES = {"policy version": "policy_version_id", "harness": "harness_id"}
RUBRICS = ("rollouts", "shell_share", "format_ok_rate", "recovery_rate", "self_verification_rate", "tool_coverage",
           "step_efficiency")
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
