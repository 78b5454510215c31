"""Behaviour: tool distributions and rubrics of two policy versions (or two harnesses), side by side.

Tool counts and pass@k are aggregated by the store over the latest rollouts of each side in the window; the rubrics
that need whole trajectories (format, recovery, self-verification, coverage, efficiency) use a smaller sample and
the same code as ``openforge analyze``. For two policy versions the page also shows what changed between them on
their evaluation rollouts, paired by task with 95% intervals: ``openforge analyze --compare A B``'s table, by the
same code (``learner.compare_versions``).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from learner import comparison_rows, compare_versions

from .._context import Context
from .._queries import SIDES, pass_rates, rubric_sample, tool_distribution

MAX_ROLLOUTS = 500
RUBRIC_SAMPLE = 50


def compare(ctx: Context, side: str, a: str, b: str, *, max_rollouts: int = MAX_ROLLOUTS,
            sample: int = RUBRIC_SAMPLE) -> dict[str, pd.DataFrame]:
    """The page's data for two slices; also what ``bench/dashboard_queries.py`` times."""
    store, sources = ctx.store, ctx.reward_sources
    tools, rates, rubrics = [], {}, {}
    for value in (a, b):
        latest = store.stats.latest_rollouts(ctx.window, side, value, max_rollouts)
        tools.append(tool_distribution(store, [r.id for r in latest]).assign(side=value))
        rates[value] = pass_rates(store, ctx.window, side, value, reward_sources=sources)
        rubrics[value] = rubric_sample(store, latest[:sample], reward_sources=sources)
    return {"tools": pd.concat(tools, ignore_index=True), "pass": pd.DataFrame(rates),
            "rubrics": pd.DataFrame(rubrics)}


def paired(ctx: Context, a: str, b: str) -> pd.DataFrame:
    """Every rubric of two policy versions on their evaluation rollouts, B - A with its 95% interval, paired by
    task (empty when neither has evaluation rollouts)."""
    diffs = compare_versions(ctx.store, a, b, purpose="eval", reward_sources=ctx.reward_sources)
    if not any(d.a is not None or d.b is not None for d in diffs if d.metric == "success_rate"):
        return pd.DataFrame()
    return pd.DataFrame(comparison_rows(diffs, "A", "B")).set_index("rubric")


def render(ctx: Context) -> None:
    st.header("Behaviour")
    side_label = st.radio("Compare", list(SIDES), horizontal=True, key="side")
    side = SIDES[side_label]
    values = ctx.store.stats.filter_options()[side]
    if not values:
        st.info(f"No rollout records a {side_label}; nothing to compare.")
        return
    cols = st.columns(2)
    a = cols[0].selectbox(f"{side_label} A", values, index=0, key="side_a")
    b = cols[1].selectbox(f"{side_label} B", values, index=min(1, len(values) - 1), key="side_b")
    data = compare(ctx, side, a, b)
    if side == "policy_version_id" and a != b:
        st.subheader("What changed from A to B: evaluation rollouts, paired by task")
        table = paired(ctx, a, b)
        if table.empty:
            st.info(f"Neither {a} nor {b} has evaluation rollouts (run purpose eval); evaluate them on the same "
                    "held-out tasks (openforge run TASKS --purpose eval) to compare them task by task.")
        else:
            st.dataframe(table, width="stretch")
            st.caption("B - A with a 95% bootstrap interval over the tasks both were evaluated on (a task's "
                       "rollouts under A and B resampled together); McNemar's exact p for success. The same "
                       "table as `openforge analyze --compare A B`.")
    tools = data["tools"]
    if tools.empty:
        st.info("These rollouts made no tool calls in this time window.")
    else:
        st.subheader("Tool-call share by category")
        st.bar_chart(tools.pivot_table(index="category", columns="side", values="share", aggfunc="sum", fill_value=0))
        st.subheader("Tool-call share by tool")
        st.bar_chart(tools.pivot_table(index="tool", columns="side", values="share", aggfunc="sum", fill_value=0))
    st.subheader("Outcomes: pass@k and pass^k (per task, averaged over tasks)")
    st.dataframe(data["pass"], width="stretch")
    st.subheader(f"Rubrics (latest {RUBRIC_SAMPLE} rollouts of each side)")
    rub = data["rubrics"]
    st.bar_chart(rub.drop(index=["rollouts"], errors="ignore").astype(float))
    st.dataframe(rub, width="stretch")
    st.caption(f"Tool counts over the latest {MAX_ROLLOUTS} rollouts of each side in the window. Rubrics as "
               "`openforge analyze` reports them (step efficiency over the rollouts that passed). Rules: "
               "learner/_rubrics.py; categories and error patterns: learner/_analysis_config.py.")
