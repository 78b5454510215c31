"""Search: every call whose text (new prompt messages, answer, tool calls and results, error) holds a piece of text,
newest first, with filters; each hit links to its step on the Timeline. Deep link: ``?page=Search&q=TEXT``.
The time window is the sidebar's; ``Store.search`` does the work on the store's own index."""

from __future__ import annotations

from urllib.parse import quote

import pandas as pd
import streamlit as st

from forge_store import StoreError

from .._context import Context

ANY = "(any)"
PURPOSES = ("train", "eval", "teacher")


def render(ctx: Context) -> None:
    st.header("Search")
    query = st.text_input("Text in any call (3 characters or more, any case)", value=st.query_params.get("q", ""),
                          key="search_q", placeholder="rm -rf")
    options = ctx.store.stats.filter_options()
    cols = st.columns(4)
    picked = {
        "task_id": cols[0].selectbox("Task", [ANY, *options["task_id"]], key="s_task"),
        "policy_version_id": cols[1].selectbox("Policy version", [ANY, *options["policy_version_id"]], key="s_pv"),
        "outcome": cols[2].selectbox("Outcome", [ANY, *options["outcome"]], key="s_outcome"),
        "purpose": cols[3].selectbox("Purpose", [ANY, *PURPOSES], key="s_purpose"),
    }
    if not query.strip():
        st.caption("Type a command, an error or any text a model or a tool wrote; hits link to their step.")
        return
    if query != st.query_params.get("q"):
        st.query_params["q"] = query
    filters = {k: v for k, v in picked.items() if v != ANY}
    try:
        hits, more = ctx.store.search(query, limit=200, since=ctx.window.since, until=ctx.window.until, **filters)
    except StoreError as exc:
        st.warning(str(exc))
        return
    if not hits:
        st.info(f"No call holds {query!r} in this time window" + (" with these filters." if filters else "."))
        return
    rollouts = len({h.rollout_id for h in hits})
    st.caption(f"Calls holding {query!r}: {len(hits)}{'+' if more else ''} in {rollouts} rollout"
               f"{'s' if rollouts != 1 else ''}, newest first"
               + (" (the newest 200 shown: narrow the search)" if more else ""))
    rows = pd.DataFrame([{"open": f"?page=Timeline&rollout={quote(h.rollout_id or '')}&call={quote(h.call_id)}",
                          "rollout": h.rollout_id, "step": None if h.seq is None else h.seq + 1,
                          "snippet": h.snippet, "task": h.task_id, "version": h.policy_version_id,
                          "outcome": h.outcome, "purpose": h.purpose, "started": h.started_at} for h in hits])
    st.dataframe(rows, hide_index=True, width="stretch",
                 column_config={"open": st.column_config.LinkColumn("open", display_text="timeline"),
                                "snippet": st.column_config.TextColumn("snippet", width="large")})
    first = hits[0]
    st.markdown(f"First hit: rollout `{first.rollout_id}` step {(first.seq or 0) + 1}: {first.snippet}")
