"""Windowed aggregates for the dashboards: ``store.stats.<query>(window, ...)``, computed in SQL on the store's
own database (SQLite or PostgreSQL) and returned as plain rows (dicts), small whatever the store's size.

Every query over rollouts takes a :class:`Window` on ``rollouts.started_at`` (indexed); lists are pages or capped by
a limit. Rewards follow the store's one rule (:mod:`forge_store._rewards`), with its source filter. Nothing here
writes. ``bench/dashboard_queries.py`` times these on a million-call PostgreSQL store.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from . import _schema as schema
from ._errors import StoreError
from ._records import RolloutInfo
from ._rewards import check_sources, latest_rewards_query

R = schema.Rollout.__table__
C = schema.Call.__table__
E = schema.Exclusion.__table__
X = schema.Export.__table__
T = schema.Task.__table__
FILTERS = ("policy_version_id", "harness_id", "task_id", "outcome")


@dataclass(frozen=True)
class Window:
    """Rollouts started in ``[since, until)``; None leaves that side open."""

    since: datetime | None = None
    until: datetime | None = None


def _within(q, window: Window):
    if window.since is not None:
        q = q.where(R.c.started_at >= window.since)
    if window.until is not None:
        q = q.where(R.c.started_at < window.until)
    return q


def _column(name: str) -> sa.Column:
    if name not in FILTERS:
        raise StoreError(f"rollout column {name!r} cannot be filtered on here: use one of {', '.join(FILTERS)}")
    return R.c[name]


def _percentile(values: Sequence[float], q: float) -> float | None:
    """PostgreSQL's ``percentile_cont`` (linear interpolation between closest ranks), for SQLite, which lacks it."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class Stats:
    """The dashboards' aggregates over one store's database (``Store.stats``)."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        self._pg = engine.dialect.name == "postgresql"

    def _rows(self, q, params: dict | None = None) -> list[dict]:
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(q, params or {}).mappings()]

    # ---- the store's extent ----------------------------------------------------------------------------------
    def time_range(self) -> tuple[datetime | None, datetime | None]:
        """Start time of the first and of the last rollout (None, None in a store without rollouts)."""
        with self.engine.connect() as conn:
            lo, hi = conn.execute(sa.select(sa.func.min(R.c.started_at), sa.func.max(R.c.started_at))).one()
        return lo, hi

    def filter_options(self) -> dict[str, list[str]]:
        """Distinct values of each filterable rollout column (tasks: the tasks table, else the rollouts' task ids)."""
        with self.engine.connect() as conn:
            def distinct(col):
                return sorted(v for (v,) in conn.execute(sa.select(col).distinct()) if v is not None)
            return {"policy_version_id": distinct(R.c.policy_version_id), "harness_id": distinct(R.c.harness_id),
                    "task_id": distinct(T.c.id) or distinct(R.c.task_id), "outcome": distinct(R.c.outcome)}

    # ---- overview --------------------------------------------------------------------------------------------
    def success_by_day(self, window: Window) -> list[dict]:
        """Finished rollouts and successes per policy version and day (``day``: ISO date), by day."""
        day = sa.func.date(R.c.started_at).label("day")
        success = sa.func.sum(sa.case((R.c.outcome == "success", 1), else_=0))
        rows = self._rows(_within(
            sa.select(R.c.policy_version_id, day, sa.func.count().label("rollouts"), success.label("successes"))
            .where(R.c.status == "finished").group_by(R.c.policy_version_id, day).order_by(day), window))
        return [{**r, "day": str(r["day"])} for r in rows]

    def success_by_version(self, window: Window) -> list[dict]:
        """Finished rollouts per policy version and purpose (the rollout metadata's ``purpose``: ``train``, ``eval``
        or ``teacher``; ``train`` where none is recorded, as the learner reads it), with ``graded`` (an outcome that is
        not ``infra_error``: an infrastructure failure is no failure of the policy) and ``successes``."""
        purpose = sa.func.coalesce(R.c.metadata["purpose"].as_string(), "train")
        graded = sa.func.sum(sa.case((R.c.outcome.is_not(None) & (R.c.outcome != "infra_error"), 1), else_=0))
        success = sa.func.sum(sa.case((R.c.outcome == "success", 1), else_=0))
        rows = self._rows(_within(
            sa.select(R.c.policy_version_id, purpose.label("purpose"), sa.func.count().label("rollouts"),
                      graded.label("graded"), success.label("successes"))
            .where(R.c.status == "finished").group_by(R.c.policy_version_id, purpose), window))
        return [{**r, "graded": int(r["graded"] or 0), "successes": int(r["successes"] or 0)} for r in rows]

    def outcomes(self, window: Window) -> list[dict]:
        """Finished rollouts per policy version and outcome."""
        return self._rows(_within(
            sa.select(R.c.policy_version_id, R.c.outcome, sa.func.count().label("rollouts"))
            .where(R.c.status == "finished").group_by(R.c.policy_version_id, R.c.outcome), window))

    def latency(self, window: Window) -> list[dict]:
        """Rollouts and p50 / p95 wall-clock latency (``p50_s``, ``p95_s``) of finished rollouts per policy version."""
        done = sa.and_(R.c.status == "finished", R.c.ended_at.is_not(None))
        if self._pg:
            lat = sa.extract("epoch", R.c.ended_at - R.c.started_at)
            q = sa.select(R.c.policy_version_id, sa.func.count().label("rollouts"),
                          sa.func.percentile_cont(0.5).within_group(lat).label("p50_s"),
                          sa.func.percentile_cont(0.95).within_group(lat).label("p95_s")).where(done)
            return self._rows(_within(q, window).group_by(R.c.policy_version_id).order_by(R.c.policy_version_id))
        lat = (sa.func.julianday(R.c.ended_at) - sa.func.julianday(R.c.started_at)) * 86400.0
        values: dict[str | None, list[float]] = defaultdict(list)
        with self.engine.connect() as conn:
            for pv, v in conn.execute(_within(sa.select(R.c.policy_version_id, lat).where(done), window)):
                values[pv].append(v)
        return [{"policy_version_id": pv, "rollouts": len(v), "p50_s": _percentile(v, 0.5),
                 "p95_s": _percentile(v, 0.95)} for pv, v in sorted(values.items(), key=lambda kv: str(kv[0]))]

    def exclusions(self, window: Window) -> list[dict]:
        """Distinct excluded rollouts per exclusion reason (any export), by reason."""
        return self._rows(_within(
            sa.select(E.c.reason, sa.func.count(sa.distinct(E.c.rollout_id)).label("rollouts"))
            .select_from(E.join(R, R.c.id == E.c.rollout_id)).group_by(E.c.reason).order_by(E.c.reason), window))

    # ---- trajectories ----------------------------------------------------------------------------------------
    def rollout_page(self, window: Window, filters: dict[str, str | None] | None = None, *, page: int = 0,
                     page_size: int = 50, reward_sources: Collection[str] | None = None) -> tuple[list[dict], int]:
        """One page of rollouts (newest first) whose columns equal ``filters`` (None: any), each with its reward
        (the latest from ``reward_sources``) and its number of calls; and how many rollouts match in all."""
        sources = check_sources(reward_sources)
        q = sa.select(R.c.id, R.c.task_id, R.c.harness_id, R.c.policy_version_id, R.c.outcome, R.c.started_at,
                      R.c.ended_at)
        count = sa.select(sa.func.count()).select_from(R)
        for col, value in (filters or {}).items():
            if value:
                q, count = q.where(_column(col) == value), count.where(_column(col) == value)
        with self.engine.connect() as conn:
            total = conn.execute(_within(count, window)).scalar_one()
            rows = [dict(r) for r in conn.execute(_within(q, window).order_by(R.c.started_at.desc(), R.c.id)
                                                  .limit(page_size).offset(page * page_size)).mappings()]
            ids = [r["id"] for r in rows]
            lr = latest_rewards_query(sources=sources, rollout_ids=ids)
            rewards = dict(conn.execute(sa.select(lr.c.rollout_id, lr.c.value)).all()) if ids else {}
            n_calls = dict(conn.execute(sa.select(C.c.rollout_id, sa.func.count()).where(C.c.rollout_id.in_(ids))
                                        .group_by(C.c.rollout_id)).all()) if ids else {}
        return [{**r, "reward": rewards.get(r["id"]), "calls": n_calls.get(r["id"], 0)} for r in rows], total

    # ---- behaviour -------------------------------------------------------------------------------------------
    def latest_rollouts(self, window: Window, column: str, value: str, limit: int) -> list[RolloutInfo]:
        """The latest ``limit`` finished rollouts (newest first) whose ``column`` (a filter column) is ``value``."""
        q = _within(sa.select(R).where(_column(column) == value, R.c.status == "finished"), window)
        with self.engine.connect() as conn:
            return [RolloutInfo(**r) for r in conn.execute(q.order_by(R.c.started_at.desc()).limit(limit)).mappings()]

    def tool_counts(self, rollout_ids: Sequence[str]) -> list[dict]:
        """Tool calls per tool name (``tool``, ``calls``; most called first) over these rollouts' answers."""
        if not rollout_ids:
            return []
        return self._rows(_TOOLS_PG if self._pg else _TOOLS_SQLITE, {"ids": list(rollout_ids)})

    def task_pass_counts(self, window: Window, column: str, value: str, *, pass_threshold: float,
                         graded_outcomes: Collection[str], reward_sources: Collection[str] | None = None) -> list[dict]:
        """Per task (``task_id``): graded rollouts ``n`` and passed ones ``c``, for the rollouts whose ``column`` is
        ``value``. A rollout passes when its reward (the latest from ``reward_sources``) is at least
        ``pass_threshold``, or, without a reward, when its outcome is ``success``."""
        lr = latest_rewards_query(sources=check_sources(reward_sources))
        passed = sa.case((lr.c.value.is_not(None), sa.case((lr.c.value >= pass_threshold, 1), else_=0)),
                         (R.c.outcome == "success", 1), else_=0)
        q = (sa.select(R.c.task_id, sa.func.count().label("n"), sa.func.sum(passed).label("c"))
             .select_from(R.outerjoin(lr, lr.c.rollout_id == R.c.id))
             .where(_column(column) == value, R.c.outcome.in_(list(graded_outcomes))).group_by(R.c.task_id))
        return [{"task_id": r["task_id"], "n": int(r["n"]), "c": int(r["c"] or 0)}
                for r in self._rows(_within(q, window))]

    # ---- exports ---------------------------------------------------------------------------------------------
    def exports(self, limit: int = 100) -> list[dict]:
        """The latest ``limit`` exports, newest first."""
        return self._rows(sa.select(X.c.id, X.c.format, X.c.created_at, X.c.watermark, X.c.query, X.c.out_dir,
                                    X.c.counts, X.c.manifest).order_by(X.c.created_at.desc()).limit(limit))


_TOOLS_PG = sa.text("""SELECT tc->'function'->>'name' AS tool, count(*) AS calls FROM calls c
    CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(c.response->'tool_calls') = 'array'
                                            THEN c.response->'tool_calls' ELSE '[]'::jsonb END) AS tc
    WHERE c.rollout_id IN :ids GROUP BY 1 ORDER BY 2 DESC""").bindparams(sa.bindparam("ids", expanding=True))
_TOOLS_SQLITE = sa.text("""SELECT json_extract(j.value, '$.function.name') AS tool, count(*) AS calls FROM calls c,
    json_each(CASE WHEN json_type(c.response, '$.tool_calls') = 'array' THEN json_extract(c.response, '$.tool_calls')
              ELSE '[]' END) AS j
    WHERE c.rollout_id IN :ids GROUP BY 1 ORDER BY 2 DESC""").bindparams(sa.bindparam("ids", expanding=True))
