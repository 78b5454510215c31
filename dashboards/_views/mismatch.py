"""Mismatch: stored completions re-scored under policy versions (``openforge rescore``) against the engine's
logprobs: mean / max |dlogp|, KL(behaviour || version) by k3, the share of ratios outside [1 - eps, 1 + eps], by
behaviour version and re-scored version with their training steps, and per rollout."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from forge_store import Store
from learner import mismatch_by_version, mismatch_pairs, mismatch_per_rollout


@st.cache_data(ttl=60, show_spinner=False)
def _tables(_store: Store, url: str, watermark: int, eps: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    pairs = mismatch_pairs(_store)
    return (pd.DataFrame(mismatch_by_version(_store, pairs, eps)), pd.DataFrame(mismatch_per_rollout(pairs, eps)))


def render(store: Store) -> None:
    st.header("Logprob mismatch")
    eps = st.number_input("Ratio band eps (out of band: ratio outside [1 - eps, 1 + eps])", min_value=0.001,
                          max_value=0.999, value=0.2, step=0.05, key="mismatch_eps")
    versions, rollouts = _tables(store, store.url, store.watermark(), float(eps))
    if versions.empty:
        st.info("No re-scores yet: run `openforge rescore --version V` to score stored completions under a policy "
                "version (the version that served them first: its ratios must be 1).")
        return
    own = versions[versions["behaviour"] == versions["rescored_under"]]
    if not own.empty:
        ratio = float((own["ratio_mean"] * own["tokens"]).sum() / own["tokens"].sum())
        ok = 0.99 <= ratio <= 1.01
        (st.success if ok else st.error)(f"Self-consistency: calls re-scored under the version that served them: "
                                          f"ratio mean {ratio:.5f} ({'within' if ok else 'OUTSIDE'} [0.99, 1.01])")
    st.subheader("By behaviour version and re-scored version")
    st.dataframe(versions, hide_index=True, width="stretch")
    chart = versions.dropna(subset=["rescored_step"])
    if not chart.empty:
        st.subheader("KL(behaviour || version), k3, by training step of the re-scored version")
        st.line_chart(chart.pivot_table(index="rescored_step", columns="behaviour", values="kl_k3"))
    st.subheader("By rollout")
    st.dataframe(rollouts, hide_index=True, width="stretch")
