"""Versions: one task under each policy version along the chain (base -> SFT -> GRPO rounds): its latest finished
rollouts per version, success, mean reward, calls and tool calls per rollout, the tools used, and a link to each
version's newest rollout on the Timeline. Deep link: ``?page=Versions&task=TASK_ID``."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import streamlit as st

from learner import tool_steps

from .._context import Context
from .._queries import chain_order

PER_VERSION = 50  # at most this many of the task's rollouts per version ...
LATEST = 1000  # ... among its latest finished rollouts in the window (one query)


def version_rows(ctx: Context, task: str) -> list[dict]:
    store = ctx.store
    versions = [v["id"] for v in chain_order(store.lineage("policy_versions"))]
    latest = store.stats.latest_rollouts(ctx.window, "task_id", task, LATEST)
    rows = []
    for pv in versions:
        rollouts = [r for r in latest if r.policy_version_id == pv][:PER_VERSION]
        if not rollouts:
            continue
        ids = [r.id for r in rollouts]
        rewards = store.latest_rewards(ids, sources=ctx.reward_sources)
        summaries = store.call_summaries(ids)
        steps = {rid: tool_steps(summaries.get(rid, [])) for rid in ids}
        graded = [r for r in rollouts if r.outcome not in (None, "infra_error")]
        tools = Counter(s.name for ss in steps.values() for s in ss)
        rows.append({"policy version": pv, "rollouts": len(rollouts),
                     "success rate": (sum(r.outcome == "success" for r in graded) / len(graded)) if graded else None,
                     "mean reward": (sum(w.value for w in rewards.values()) / len(rewards)) if rewards else None,
                     "calls per rollout": sum(len(summaries.get(i, [])) for i in ids) / len(ids),
                     "tool calls per rollout": sum(len(s) for s in steps.values()) / len(ids),
                     "tools": ", ".join(f"{n} x{c}" for n, c in tools.most_common(5)),
                     "newest": f"?page=Timeline&rollout={rollouts[0].id}"})
    return rows


def render(ctx: Context) -> None:
    st.header("Versions")
    tasks = ctx.store.stats.filter_options()["task_id"]
    if not tasks:
        st.info("No tasks in this store.")
        return
    linked = st.query_params.get("task")
    task = st.selectbox("Task", tasks, key="v_task", index=tasks.index(linked) if linked in tasks else 0)
    if task != linked:
        st.query_params["task"] = task
    rows = version_rows(ctx, task)
    if not rows:
        st.info(f"No finished rollout of {task} in this time window.")
        return
    st.caption(f"Task `{task}` under each policy version, parent before child (the latest {PER_VERSION} finished "
               "rollouts of each; success over graded rollouts, infrastructure errors left out)")
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
                 column_config={"newest": st.column_config.LinkColumn("newest", display_text="timeline"),
                                "success rate": st.column_config.NumberColumn(format="percent"),
                                "mean reward": st.column_config.NumberColumn(format="%.3f")})
