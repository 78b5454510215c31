"""Group: the rollouts of one GRPO group side by side: reward, advantage, steps, tools, and where their actions
first diverge, with every rollout's actions in columns. Deep link: ``?page=Group&group=GROUP_ID`` (the Timeline
links each rollout's group)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from forge_store import StoreError

from .._context import Context
from .._group import group_view
from .._queries import rollout_page


def _default_group(ctx: Context) -> str | None:
    rows, _ = rollout_page(ctx.store, ctx.window, {}, page=0, page_size=50, reward_sources=ctx.reward_sources)
    infos = ctx.store.rollouts(list(rows["id"])) if not rows.empty else {}
    return next((infos[i].group_id for i in rows["id"] if i in infos and infos[i].group_id), None)


def render(ctx: Context) -> None:
    st.header("Group")
    gid = st.text_input("GRPO group id", value=st.query_params.get("group") or _default_group(ctx) or "",
                        key="group_id")
    if not gid:
        st.info("No rollout in this time window belongs to a group; pass ?group=ID or widen the date range.")
        return
    if gid != st.query_params.get("group"):
        st.query_params["group"] = gid
    try:
        rollouts = ctx.store.group_rollouts([gid]).get(gid, [])
        view = group_view(ctx.store, rollouts, ctx.reward_sources) if rollouts else None
    except StoreError as exc:
        st.warning(f"Cannot show group {gid}: {exc}")
        return
    if view is None:
        st.warning(f"Group {gid!r} has no rollouts in this store; check the id (the Timeline page links each "
                   "rollout's group).")
        return
    first = rollouts[0]
    st.subheader(f"Group {gid}")
    st.caption(f"task `{first.task_id}` · policy version `{first.policy_version_id}` · {len(rollouts)} rollouts"
               + (f" · advantages: {view.note}" if view.note else ""))
    if view.diverge_at is None:
        st.markdown("**Every rollout takes the same actions.**")
    else:
        st.markdown(f"**The rollouts take the same first {view.diverge_at - 1} action(s) and diverge at action "
                    f"{view.diverge_at}.**")
    st.dataframe(pd.DataFrame(view.rows), hide_index=True, width="stretch",
                 column_config={"timeline": st.column_config.LinkColumn("timeline", display_text="open"),
                                "reward": st.column_config.NumberColumn(format="%.3f"),
                                "advantage": st.column_config.NumberColumn(format="%+.3f")})
    st.markdown("**Actions side by side** (tool name and arguments, in order)")
    st.dataframe(pd.DataFrame(view.actions), hide_index=True, width="stretch")
