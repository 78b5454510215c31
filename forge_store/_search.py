"""Full-text search over every call's text (``Store.search``): its new prompt messages, its answer and tool calls,
the tool results it was sent, its error (``forge_store._search_text``).

A query is a literal substring, matched without regard to case ("rm -rf", "Traceback", "src/app.py"), at least
three characters long: both indexes are trigram indexes (SQLite's FTS5 ``trigram`` tokenizer, PostgreSQL's pg_trgm
GIN index), which find any substring of three characters or more without scanning the calls. Hits are calls,
newest first, with the rollout they belong to and a snippet around the first match; filters narrow them by the
rollout's task, policy version, harness, outcome, purpose (``train`` where none is recorded) and start time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from . import _schema as schema
from ._errors import StoreError

S = schema.CallSearch.__table__
R = schema.Rollout.__table__
C = schema.Call.__table__
MIN_CHARS = 3
_FTS = sa.table("call_search_fts", sa.column("rowid"))
_MATCH = sa.literal_column("call_search_fts")


@dataclass(frozen=True)
class SearchHit:
    """One call whose text holds the query."""

    call_id: str
    rollout_id: str | None
    seq: int | None  # the call's place in its rollout
    task_id: str | None
    policy_version_id: str | None
    outcome: str | None
    purpose: str | None
    started_at: datetime | None  # the rollout's
    snippet: str  # the text around the first match, the match in ``[[ ]]``

    def as_dict(self) -> dict:
        return {**self.__dict__, "started_at": self.started_at.isoformat() if self.started_at else None}


def check_query(query: str) -> str:
    q = query.strip()
    if len(q) < MIN_CHARS:
        raise StoreError(f"search {query!r}: a search needs at least {MIN_CHARS} characters (the index is of "
                         "trigrams); search for a longer piece of the text")
    return q


def snippet(body: str, query: str, width: int = 80) -> str:
    """``width`` characters either side of the first match, on one line, the match in ``[[ ]]``."""
    at = body.lower().find(query.lower())
    if at < 0:  # case folding differs between Python and the index for a few scripts: show the start
        return body[: 2 * width].replace("\n", " ")
    lo, hi = max(0, at - width), min(len(body), at + len(query) + width)
    text = (("..." if lo else "") + body[lo:at] + "[[" + body[at:at + len(query)] + "]]"
            + body[at + len(query):hi] + ("..." if hi < len(body) else ""))
    return " ".join(text.split())


def search(conn: sa.Connection, query: str, *, task_id: str | None = None, policy_version_id: str | None = None,
           harness_id: str | None = None, outcome: str | None = None, purpose: str | None = None,
           since: datetime | None = None, until: datetime | None = None, limit: int = 50) -> tuple[list[SearchHit], bool]:
    """The newest ``limit`` calls whose text holds ``query``, and whether there are more."""
    q = check_query(query)
    if limit < 1:
        raise StoreError(f"search limit {limit}: ask for at least 1 hit")
    purpose_col = sa.func.coalesce(R.c.metadata["purpose"].as_string(), "train")
    cols = (S.c.call_id, S.c.rollout_id, S.c.body, C.c.seq, R.c.task_id, R.c.policy_version_id, R.c.outcome,
            purpose_col.label("purpose"), R.c.started_at)
    filtered = any(v is not None for v in (task_id, policy_version_id, harness_id, outcome, purpose, since, until))
    if conn.dialect.name == "postgresql":
        like = q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        match = S.c.body.ilike(f"%{like}%", escape="\\")
        joined = S.outerjoin(R, R.c.id == S.c.rollout_id).outerjoin(C, C.c.id == S.c.call_id)
        if filtered:  # the trigram index first (a materialised set of matches), then the rollouts' filters: walking
            # the newest calls and testing each would read most of the store when the filters keep few of them
            found = sa.select(S.c.ingest_seq).where(match).cte("found").prefix_with("MATERIALIZED")
            stmt = sa.select(*cols).select_from(found.join(joined, S.c.ingest_seq == found.c.ingest_seq))
        else:  # newest first until the limit: a common text stops early, a rare one uses the index
            stmt = sa.select(*cols).select_from(joined).where(match)
        newest = S.c.ingest_seq.desc()
    else:  # the FTS5 table drives the query, newest rowid first, so a LIMIT stops it early (no sort of every hit)
        phrase = '"' + q.replace('"', '""') + '"'
        stmt = (sa.select(*cols).select_from(_FTS.join(S, S.c.ingest_seq == _FTS.c.rowid)
                                             .outerjoin(R, R.c.id == S.c.rollout_id)
                                             .outerjoin(C, C.c.id == S.c.call_id))
                .where(_MATCH.op("MATCH")(phrase)))
        newest = _FTS.c.rowid.desc()
    for col, value in ((R.c.task_id, task_id), (R.c.policy_version_id, policy_version_id),
                       (R.c.harness_id, harness_id), (R.c.outcome, outcome), (purpose_col, purpose)):
        if value is not None:
            stmt = stmt.where(col == value)
    if since is not None:
        stmt = stmt.where(R.c.started_at >= since)
    if until is not None:
        stmt = stmt.where(R.c.started_at < until)
    rows = conn.execute(stmt.order_by(newest).limit(limit + 1)).mappings().all()
    hits = [SearchHit(call_id=r["call_id"], rollout_id=r["rollout_id"], seq=r["seq"], task_id=r["task_id"],
                      policy_version_id=r["policy_version_id"], outcome=r["outcome"],
                      purpose=r["purpose"] if r["started_at"] is not None else None, started_at=r["started_at"],
                      snippet=snippet(r["body"], q)) for r in rows[:limit]]
    return hits, len(rows) > limit
