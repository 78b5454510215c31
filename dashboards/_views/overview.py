"""Overview: success rate by policy version over time, rollout latency, error and exclusion rates with reasons."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from .._context import Context
from .._queries import overview


def render(ctx: Context) -> None:
    st.header("Overview")
    data = overview(ctx.store, ctx.window)
    by_day, outcomes = data["by_day"], data["outcomes"]
    if outcomes.empty:
        st.info("No finished rollouts in this time window; widen the date range in the sidebar.")
        return
    total = int(outcomes["rollouts"].sum())
    counts = outcomes.groupby("outcome")["rollouts"].sum()
    cols = st.columns(4)
    cols[0].metric("Finished rollouts", f"{total:,}")
    cols[1].metric("Success rate", f"{counts.get('success', 0) / total:.1%}")
    cols[2].metric("Timeout rate", f"{counts.get('policy_timeout', 0) / total:.1%}")
    cols[3].metric("Infra-error rate", f"{counts.get('infra_error', 0) / total:.1%}")

    st.subheader("Success rate by policy version")
    wide = by_day.pivot_table(index="day", columns="policy_version_id", values="success_rate")
    st.line_chart(wide)

    left, right = st.columns(2)
    with left:
        st.subheader("Outcomes by policy version")
        st.bar_chart(outcomes.pivot_table(index="policy_version_id", columns="outcome", values="rollouts", fill_value=0))
        rates = outcomes.pivot_table(index="policy_version_id", columns="outcome", values="rollouts", fill_value=0)
        st.dataframe((rates.T / rates.sum(axis=1)).T.style.format("{:.1%}"), width="stretch")
    with right:
        st.subheader("Rollout latency (s)")
        st.dataframe(data["latency"], hide_index=True, width="stretch")
        st.subheader("Exclusions by reason")
        excl = data["exclusions"]
        if excl.empty:
            st.caption("No rollout in this window was excluded from training data.")
        else:
            excl = excl.assign(rate=excl["rollouts"] / total)
            st.bar_chart(excl.set_index("reason")["rollouts"])
            st.dataframe(pd.DataFrame(excl), hide_index=True, width="stretch")
