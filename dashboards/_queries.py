"""The dashboards' queries: aggregation in SQL on the store's own database (SQLite or PostgreSQL), bounded results.

Every query takes a time window on ``rollouts.started_at`` (indexed) and returns small frames: aggregates, one page
of rollouts, or tool counts over the latest ``max_rollouts`` rollouts of a slice. Nothing here writes.
Rubrics that need whole trajectories (recovery, self-verification, format) run on a sample
(:func:`rubric_sample`), never on the full store.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

import pandas as pd
import sqlalchemy as sa

from forge_store import _schema as schema
from learner._analysis_config import RubricConfig
from learner._analysis_reads import light_calls
from learner._rubrics import pass_at_k, pass_hat_k, percentile, rollout_rubrics

R = schema.Rollout.__table__
C = schema.Call.__table__
W = schema.Reward.__table__
E = schema.Exclusion.__table__
X = schema.Export.__table__
SIDES = {"policy version": "policy_version_id", "harness": "harness_id"}


@dataclass(frozen=True)
class Window:
    since: datetime | None = None
    until: datetime | None = None

    def where(self, q):
        if self.since is not None:
            q = q.where(R.c.started_at >= self.since)
        if self.until is not None:
            q = q.where(R.c.started_at < self.until)
        return q


def _pg(engine: sa.Engine) -> bool:
    return engine.dialect.name == "postgresql"


def _latency(engine: sa.Engine):
    if _pg(engine):
        return sa.extract("epoch", R.c.ended_at - R.c.started_at)
    return (sa.func.julianday(R.c.ended_at) - sa.func.julianday(R.c.started_at)) * 86400.0


def _frame(result) -> pd.DataFrame:
    return pd.DataFrame(result.mappings().all())


def _latest_reward():
    latest = sa.select(W.c.rollout_id, sa.func.max(W.c.ingest_seq).label("seq")).group_by(W.c.rollout_id).subquery()
    return sa.select(W.c.rollout_id, W.c.value).join(
        latest, sa.and_(latest.c.rollout_id == W.c.rollout_id, latest.c.seq == W.c.ingest_seq)).subquery()


# ---- store state ---------------------------------------------------------------------------------------------
def time_range(engine: sa.Engine) -> tuple[datetime | None, datetime | None]:
    with engine.connect() as conn:
        lo, hi = conn.execute(sa.select(sa.func.min(R.c.started_at), sa.func.max(R.c.started_at))).one()
    return lo, hi


def filter_options(engine: sa.Engine) -> dict[str, list[str]]:
    """Distinct values for the filters (small lineage tables, indexed rollout columns)."""
    with engine.connect() as conn:
        def distinct(col):
            return sorted(v for (v,) in conn.execute(sa.select(col).distinct()) if v is not None)
        return {"policy_version_id": distinct(R.c.policy_version_id), "harness_id": distinct(R.c.harness_id),
                "task_id": distinct(schema.Task.__table__.c.id) or distinct(R.c.task_id),
                "outcome": distinct(R.c.outcome)}


# ---- overview ------------------------------------------------------------------------------------------------
def overview(engine: sa.Engine, window: Window) -> dict[str, pd.DataFrame]:
    """Success rate by policy version per day, outcome counts, latency percentiles, exclusions by reason."""
    finished = R.c.status == "finished"
    success = sa.func.sum(sa.case((R.c.outcome == "success", 1), else_=0))
    day = sa.func.date(R.c.started_at).label("day")
    with engine.connect() as conn:
        by_day = _frame(conn.execute(window.where(
            sa.select(R.c.policy_version_id, day, sa.func.count().label("rollouts"), success.label("successes"))
            .where(finished).group_by(R.c.policy_version_id, day).order_by(day))))
        outcomes = _frame(conn.execute(window.where(
            sa.select(R.c.policy_version_id, R.c.outcome, sa.func.count().label("rollouts"))
            .where(finished).group_by(R.c.policy_version_id, R.c.outcome))))
        latency = _latency_table(engine, conn, window)
        excl = _frame(conn.execute(window.where(
            sa.select(E.c.reason, sa.func.count(sa.distinct(E.c.rollout_id)).label("rollouts"))
            .select_from(E.join(R, R.c.id == E.c.rollout_id)).group_by(E.c.reason).order_by(E.c.reason))))
    if not by_day.empty:
        by_day["success_rate"] = by_day["successes"] / by_day["rollouts"]
        by_day["day"] = by_day["day"].astype(str)
    return {"by_day": by_day, "outcomes": outcomes, "latency": latency, "exclusions": excl}


def _latency_table(engine, conn, window: Window) -> pd.DataFrame:
    lat = _latency(engine)
    done = sa.and_(R.c.status == "finished", R.c.ended_at.is_not(None))
    if _pg(engine):
        q = sa.select(R.c.policy_version_id, sa.func.count().label("rollouts"),
                      sa.func.percentile_cont(0.5).within_group(lat).label("p50_s"),
                      sa.func.percentile_cont(0.95).within_group(lat).label("p95_s")).where(done)
        return _frame(conn.execute(window.where(q).group_by(R.c.policy_version_id).order_by(R.c.policy_version_id)))
    values: dict[str, list[float]] = defaultdict(list)
    for pv, v in conn.execute(window.where(sa.select(R.c.policy_version_id, lat).where(done))):
        values[pv].append(v)
    return pd.DataFrame([{"policy_version_id": pv, "rollouts": len(v), "p50_s": percentile(v, 50),
                          "p95_s": percentile(v, 95)} for pv, v in sorted(values.items(), key=lambda kv: str(kv[0]))])


# ---- trajectory browser --------------------------------------------------------------------------------------
def rollout_page(engine: sa.Engine, window: Window, filters: dict[str, str | None], *, page: int = 0,
                 page_size: int = 50) -> tuple[pd.DataFrame, int]:
    """One page of rollouts (newest first) matching ``filters`` (column -> value), and the total count."""
    q = sa.select(R.c.id, R.c.task_id, R.c.harness_id, R.c.policy_version_id, R.c.outcome, R.c.started_at,
                  R.c.ended_at)
    count = sa.select(sa.func.count()).select_from(R)
    for col, value in filters.items():
        if value:
            q, count = q.where(R.c[col] == value), count.where(R.c[col] == value)
    q, count = window.where(q), window.where(count)
    with engine.connect() as conn:
        total = conn.execute(count).scalar_one()
        rows = _frame(conn.execute(q.order_by(R.c.started_at.desc(), R.c.id).limit(page_size).offset(page * page_size)))
        if not rows.empty:
            ids = list(rows["id"])
            lr = _latest_reward()
            rewards = dict(conn.execute(sa.select(lr.c.rollout_id, lr.c.value).where(lr.c.rollout_id.in_(ids))).all())
            n_calls = dict(conn.execute(sa.select(C.c.rollout_id, sa.func.count()).where(C.c.rollout_id.in_(ids))
                                        .group_by(C.c.rollout_id)).all())
            rows["reward"] = [rewards.get(i) for i in ids]
            rows["calls"] = [n_calls.get(i, 0) for i in ids]
    return rows, total


# ---- behaviour -----------------------------------------------------------------------------------------------
def latest_rollouts(engine: sa.Engine, window: Window, side: str, value: str, limit: int) -> list[str]:
    q = window.where(sa.select(R.c.id).where(R.c[side] == value, R.c.status == "finished"))
    with engine.connect() as conn:
        return list(conn.execute(q.order_by(R.c.started_at.desc()).limit(limit)).scalars())


_TOOLS_PG = sa.text("""SELECT tc->'function'->>'name' AS tool, count(*) AS calls FROM calls c
    CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(c.response->'tool_calls') = 'array'
                                            THEN c.response->'tool_calls' ELSE '[]'::jsonb END) AS tc
    WHERE c.rollout_id IN :ids GROUP BY 1 ORDER BY 2 DESC""").bindparams(sa.bindparam("ids", expanding=True))
_TOOLS_SQLITE = sa.text("""SELECT json_extract(j.value, '$.function.name') AS tool, count(*) AS calls FROM calls c,
    json_each(CASE WHEN json_type(c.response, '$.tool_calls') = 'array' THEN json_extract(c.response, '$.tool_calls')
              ELSE '[]' END) AS j
    WHERE c.rollout_id IN :ids GROUP BY 1 ORDER BY 2 DESC""").bindparams(sa.bindparam("ids", expanding=True))


def tool_distribution(engine: sa.Engine, rollout_ids: list[str], config: RubricConfig | None = None) -> pd.DataFrame:
    """Tool calls per tool name (with category and share) over the given rollouts, counted in SQL."""
    config = config or RubricConfig()
    if not rollout_ids:
        return pd.DataFrame(columns=["tool", "category", "calls", "share"])
    with engine.connect() as conn:
        df = _frame(conn.execute(_TOOLS_PG if _pg(engine) else _TOOLS_SQLITE, {"ids": rollout_ids}))
    if df.empty:
        return pd.DataFrame(columns=["tool", "category", "calls", "share"])
    df["category"] = [config.category(t) for t in df["tool"]]
    df["share"] = df["calls"] / df["calls"].sum()
    return df[["tool", "category", "calls", "share"]]


def pass_rates(engine: sa.Engine, window: Window, side: str, value: str, ks: tuple[int, ...] = (1, 5),
               config: RubricConfig | None = None) -> dict[str, float | None]:
    """Success rate, mean pass@k and pass^k over tasks for one slice; counts per task come from SQL."""
    config = config or RubricConfig()
    lr = _latest_reward()
    passed = sa.case((lr.c.value.is_not(None), sa.case((lr.c.value >= config.pass_threshold, 1), else_=0)),
                     (R.c.outcome == "success", 1), else_=0)
    q = (sa.select(R.c.task_id, sa.func.count().label("n"), sa.func.sum(passed).label("c"))
         .select_from(R.outerjoin(lr, lr.c.rollout_id == R.c.id))
         .where(R.c[side] == value, R.c.outcome.in_(config.graded_outcomes)).group_by(R.c.task_id))
    with engine.connect() as conn:
        per_task = [(int(n), int(c or 0)) for _, n, c in conn.execute(window.where(q))]
    n_all = sum(n for n, _ in per_task)
    out: dict[str, float | None] = {"graded": n_all, "success_rate": sum(c for _, c in per_task) / n_all if n_all else None}
    for k in ks:
        at = [pass_at_k(n, c, k) for n, c in per_task if n >= k]
        hat = [pass_hat_k(n, c, k) for n, c in per_task if n >= k]
        out[f"pass@{k}"] = sum(at) / len(at) if at else None
        out[f"pass^{k}"] = sum(hat) / len(hat) if hat else None
    return out


def rubric_sample(engine: sa.Engine, rollout_ids: list[str], config: RubricConfig | None = None) -> dict[str, float | None]:
    """Pooled rubrics over a sample of whole trajectories."""
    config = config or RubricConfig()
    tasks: dict[str, dict] = {}
    with engine.connect() as conn:
        task_of = dict(conn.execute(sa.select(R.c.id, R.c.task_id).where(R.c.id.in_(rollout_ids))).all()) if rollout_ids else {}
        wanted = sorted({t for t in task_of.values() if t})
        if wanted:
            T = schema.Task.__table__
            tasks = {i: m or {} for i, m in conn.execute(sa.select(T.c.id, T.c["metadata"]).where(T.c.id.in_(wanted)))}
    calls = light_calls(engine, rollout_ids)
    rs = [rollout_rubrics(calls.get(rid, []), task_metadata=tasks.get(task_of.get(rid)), config=config, rollout_id=rid)
          for rid in rollout_ids]
    tool_calls = sum(r.n_tool_calls for r in rs)
    failed = sum(r.failed for r in rs)
    wrote = [r for r in rs if r.wrote]

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None

    return {"rollouts": len(rs), "shell_share": sum(r.category_counts.get("shell", 0) for r in rs) / tool_calls
            if tool_calls else None,
            "format_ok_rate": sum(r.format_ok for r in rs) / tool_calls if tool_calls else None,
            "recovery_rate": sum(r.recovered for r in rs) / failed if failed else None,
            "self_verification_rate": sum(bool(r.self_verified) for r in wrote) / len(wrote) if wrote else None,
            "tool_coverage": mean(r.coverage for r in rs), "step_efficiency": mean(r.efficiency for r in rs)}


# ---- exports -------------------------------------------------------------------------------------------------
def exports(engine: sa.Engine, limit: int = 100) -> pd.DataFrame:
    with engine.connect() as conn:
        return _frame(conn.execute(sa.select(X.c.id, X.c.format, X.c.created_at, X.c.watermark, X.c.query,
                                             X.c.out_dir, X.c.counts, X.c.manifest)
                                   .order_by(X.c.created_at.desc()).limit(limit)))
