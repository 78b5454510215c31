"""The OpenForge dashboard (Streamlit): ``openforge dashboard --store URL``. Read-only, one module per page, but for
Annotate: behind a login, it appends human labels through the Store API."""

from __future__ import annotations

import streamlit as st

from dashboards._context import Context, open_or_explain, sidebar_reward_sources, sidebar_window, store_url
from dashboards._views import (annotate, behaviour, exports, group, mismatch, overview, search, timeline,
                               tokens, trajectories, versions)

PAGES = {"Overview": overview, "Trajectories": trajectories, "Timeline": timeline, "Tokens": tokens,
         "Search": search, "Group": group, "Versions": versions, "Behaviour": behaviour, "Exports": exports,
         "Mismatch": mismatch, "Annotate": annotate}


def main() -> None:
    st.set_page_config(page_title="OpenForge", layout="wide")
    url = store_url()
    # deep links: ?page=Timeline&rollout=ID&step=N, ?page=Tokens&rollout=ID&segment=N, ?page=Search&q=TEXT
    wanted = st.query_params.get("page")
    page = st.sidebar.radio("Page", list(PAGES), key="page",
                            index=list(PAGES).index(wanted) if wanted in PAGES else 0)
    st.sidebar.caption(url.split("@")[-1])
    store = open_or_explain(url)
    if store is None:
        return
    if page == "Annotate":
        PAGES[page].render(store, url)
        return
    if page in ("Exports", "Mismatch"):
        PAGES[page].render(store)
        return
    window = sidebar_window(store)
    if window is None:
        st.info("This store has no rollouts yet. Run `openforge` rollouts (or point --store at another store) and "
                "reload this page.")
        return
    PAGES[page].render(Context(store=store, window=window, reward_sources=sidebar_reward_sources()))


main()
