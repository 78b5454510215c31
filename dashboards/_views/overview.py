"""Overview: success rate along the policy chain (evaluation and training rollouts apart) and by day, rollout latency,
error and exclusion rates with reasons."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from .._context import Context
from .._queries import overview, success_along_chain


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

    chain_chart(success_along_chain(ctx.store, ctx.window))

    day_chart(by_day)

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


def day_chart(by_day: pd.DataFrame) -> None:
    """Success rate per policy version and day: lines with a point on every day, so a single day (every rollout of
    a demo) shows its points instead of an empty chart."""
    st.subheader("Success rate by policy version and day")
    if by_day.empty:
        st.caption("No finished rollout in this window.")
        return
    data = by_day.assign(policy_version_id=by_day["policy_version_id"].fillna("(none)"))
    days = data["day"].nunique()
    chart = alt.Chart(data).mark_line(point=alt.OverlayMarkDef(size=80)).encode(
        x=alt.X("day:N", title="day", sort=sorted(data["day"].unique())),
        y=alt.Y("success_rate:Q", title="success rate", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("policy_version_id:N", title="policy version"),
        tooltip=["day", "policy_version_id", "rollouts", "successes", alt.Tooltip("success_rate:Q", format=".1%")])
    st.altair_chart(chart, width="stretch")
    if days == 1:
        st.caption(f"Every rollout in this window started on {data['day'].iloc[0]}: one point per policy version.")


def chain_chart(chain: pd.DataFrame) -> None:
    """Success rate per policy version along the lineage chain (base -> SFT -> GRPO rounds), one line per purpose:
    evaluation rollouts and training rollouts apart (and a teacher's demonstrations), with 95% intervals."""
    st.subheader("Success rate along the policy chain")
    graded = chain[chain["graded"] > 0]
    if graded.empty:
        st.caption("No graded rollout in this window (infrastructure errors are not counted as failures).")
        return
    order = list(dict.fromkeys(chain["policy_version_id"]))
    x = alt.X("policy_version_id:N", sort=order, title="policy version (parent before child)")
    color = alt.Color("purpose:N", title="rollouts")
    base = alt.Chart(graded).encode(x=x, color=color)
    tooltip = ["policy_version_id", "parent", "purpose", "successes", "graded",
               alt.Tooltip("success_rate:Q", format=".1%"), alt.Tooltip("ci_low:Q", format=".1%"),
               alt.Tooltip("ci_high:Q", format=".1%")]
    line = base.mark_line(point=True).encode(y=alt.Y("success_rate:Q", title="success rate",
                                                     scale=alt.Scale(domain=[0, 1])), tooltip=tooltip)
    band = base.mark_rule(opacity=0.4).encode(y="ci_low:Q", y2="ci_high:Q")
    st.altair_chart(line + band, width="stretch")
    st.caption("Success: rollouts whose outcome is success, over graded ones (infrastructure errors left out); bars "
               "are 95% (Wilson) intervals. Evaluation rollouts are never trained on.")
    st.dataframe(chain.drop(columns="position"), hide_index=True, width="stretch",
                 column_config={c: st.column_config.NumberColumn(format="percent")
                                for c in ("success_rate", "ci_low", "ci_high")})
