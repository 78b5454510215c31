"""The latest-reward rule, in one place.

Rewards are append-only: a re-grade (a judge after the verifier, a human correction) is a new row, never an
overwrite. The reward that counts for a rollout is **its latest row by ingest order (highest ``ingest_seq``) among
the chosen sources**; with no sources chosen (None), every source counts. An empty choice counts none.
Superseded rows stay in the store, and whoever uses a reward records which row it took (an export keeps its id).

The rule has three forms, side by side so that they cannot drift apart (``tests/test_latest_reward.py`` checks that
they agree):

* :func:`latest_reward`: over ``RewardInfo`` rows in Python (a trajectory already read);
* :func:`latest_rewards_query`: SQL for the store's own reads (``Store.latest_rewards``, the dashboards'
  aggregates in :mod:`forge_store._stats`);
* :data:`DUCKDB_VIEWS`: the DuckDB table macro ``latest_rewards(sources)`` and the ``rewards`` view's
  ``is_latest``, for the analysis views (:mod:`forge_store._duckdb_views`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import sqlalchemy as sa

from . import _schema as schema
from ._errors import InvalidRecord
from ._records import REWARD_SOURCES, RewardInfo

_W = schema.Reward.__table__


def check_sources(sources: Iterable[str] | None) -> tuple[str, ...] | None:
    """``sources`` as a tuple (None: every source); a source the data model does not know is an error."""
    if sources is None:
        return None
    sources = tuple(sources)
    for s in sources:
        if s not in REWARD_SOURCES:
            raise InvalidRecord(f"reward source {s!r} is not one of {', '.join(REWARD_SOURCES)}: choose among "
                                "those, or none for every source")
    return sources


def latest_reward(rewards: Iterable[RewardInfo], sources: Collection[str] | None = None) -> RewardInfo | None:
    """The reward that counts among ``rewards`` (one rollout's rows, any order), or None when no row qualifies."""
    best = None
    for r in rewards:
        if sources is not None and r.source not in sources:
            continue
        if best is None or r.ingest_seq > best.ingest_seq:
            best = r
    return best


def latest_rewards_query(*, sources: Collection[str] | None = None, as_of: int | None = None,
                         rollout_ids: Sequence[str] | None = None) -> sa.Subquery:
    """The reward rows that count, one per rollout that has one (every column of ``rewards``), as a subquery.

    ``as_of`` pins the store to a watermark (rows ingested later do not exist yet); ``rollout_ids`` narrows the
    rollouts (keep the list short: it becomes an IN list)."""
    pick = []
    if sources is not None:
        pick.append(_W.c.source.in_(list(sources)))
    if as_of is not None:
        pick.append(_W.c.ingest_seq <= as_of)
    if rollout_ids is not None:
        pick.append(_W.c.rollout_id.in_(list(rollout_ids)))
    newest = (sa.select(_W.c.rollout_id, sa.func.max(_W.c.ingest_seq).label("seq"))
              .where(*pick).group_by(_W.c.rollout_id).subquery("newest"))
    return (sa.select(_W).join(newest, sa.and_(newest.c.rollout_id == _W.c.rollout_id, newest.c.seq == _W.c.ingest_seq))
            .subquery("latest_reward"))


# DuckDB, over the snapshot / live tables the views attach as ``store."<table>"``.
# ``latest_rewards()`` or ``latest_rewards(['verifier', 'judge'])``: one row per rollout, every column of rewards.
DUCKDB_VIEWS = (
    """CREATE MACRO latest_rewards(sources := NULL) AS TABLE
       SELECT * EXCLUDE (newest_first) FROM (
         SELECT r.*, row_number() OVER (PARTITION BY r.rollout_id ORDER BY r.ingest_seq DESC) AS newest_first
         FROM store.rewards r WHERE sources IS NULL OR list_contains(sources, r.source))
       WHERE newest_first = 1""",
    """CREATE VIEW rewards AS SELECT r.*, l.id IS NOT NULL AS is_latest
       FROM store.rewards r LEFT JOIN latest_rewards() l ON l.id = r.id""",
)
