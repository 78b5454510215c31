"""What every page needs: the store (opened read-only, cached), the time window, and clear messages for bad stores.

The store URL comes from ``--store`` after ``--`` (``streamlit run app.py -- --store URL``, which
``openforge dashboard`` passes) or from the settings (``OPENFORGE_STORE_URL`` / ``OPENFORGE_HOME``). The store is
opened with ``auto_upgrade`` off, so pointing the dashboard at an empty database never creates tables.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone

import streamlit as st

from forge_store import REWARD_SOURCES, SchemaMismatch, Store, StoreError, Window, get_settings, open_store


@dataclass(frozen=True)
class Context:
    store: Store
    window: Window
    reward_sources: tuple[str, ...] | None = None  # the rewards that count (None: every source)


def store_url(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--store", default=None)
    args, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return args.store or get_settings().resolved_store_url()


@st.cache_resource(show_spinner=False)
def _open(url: str) -> Store:
    return open_store(url, settings=get_settings(auto_upgrade=False))


def open_or_explain(url: str) -> Store | None:
    """The store, or None after telling the user (st.info / st.warning / st.error) why it cannot be shown."""
    try:
        return _open(url)
    except SchemaMismatch as exc:
        if "is empty" in str(exc):
            st.info(f"This store has no tables yet, so there is nothing to show. {exc}")
        else:
            st.warning(f"This store's schema does not match this dashboard. {exc}")
    except StoreError as exc:
        st.error(f"Cannot open the store. {exc}")
    return None


def sidebar_window(store: Store) -> Window | None:
    """A date range over the rollouts' start times (default: the last 30 days that have data)."""
    lo, hi = store.stats.time_range()
    if lo is None:
        return None
    first, last = lo.date(), hi.date()
    default_start = max(first, last - timedelta(days=30))
    picked = st.sidebar.date_input("Rollouts started between", value=(default_start, last), min_value=first,
                                   max_value=last, key="window")
    start, end = (picked if isinstance(picked, (tuple, list)) and len(picked) == 2 else (default_start, last))
    return Window(since=datetime.combine(start, time.min, tzinfo=timezone.utc),
                  until=datetime.combine(end, time.min, tzinfo=timezone.utc) + timedelta(days=1))


def sidebar_reward_sources() -> tuple[str, ...] | None:
    """Which reward sources count (the store's latest-reward rule takes the latest of these); none picked: all."""
    picked = st.sidebar.multiselect("Rewards from", list(REWARD_SOURCES), default=[], key="reward_sources",
                                    placeholder="every source",
                                    help="A rollout's reward is its latest from these sources (rewards are "
                                         "append-only: a re-grade is a later row).")
    return tuple(picked) or None
