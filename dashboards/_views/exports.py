"""Exports: every training export, its manifest and what it was built from (query, watermark, counts)."""

from __future__ import annotations

import json

import streamlit as st

from forge_store import Store

from .._queries import exports


def render(store: Store) -> None:
    st.header("Exports")
    df = exports(store)
    if df.empty:
        st.info("No exports yet: run `openforge export --out DIR` to build training shards.")
        return
    st.dataframe(df[["id", "format", "created_at", "watermark", "query", "out_dir"]], hide_index=True,
                 width="stretch")
    chosen = st.selectbox("Export", list(df["id"]), key="export_id")
    row = df[df["id"] == chosen].iloc[0]
    st.markdown(f"**{row['id']}**: format `{row['format']}`, store watermark `{row['watermark']}`, "
                f"query `{row['query'] or '(all)'}`, folder `{row['out_dir']}`")
    left, right = st.columns(2)
    left.subheader("Counts")
    left.json(_as_json(row["counts"]))
    right.subheader("Manifest")
    right.json(_as_json(row["manifest"]), expanded=False)


def _as_json(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return {"text": value}
    return value or {}
