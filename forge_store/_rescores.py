"""Re-scores: a stored completion's teacher-forced logprobs under a policy version, append-only.

One row per (call, policy version, scorer): the logprob of every completion token of the call (the ids the engine
sampled, from the store, never re-tokenized) under the version's weights, as computed by one scorer (the Hugging
Face model on a CPU, a served engine's ``prompt_logprobs``, ...). ``scorer_lineage`` says what computed them
(checkpoint hash, dtype, engine and its version), so two rows of different scorers for the same call and version
are both kept and told apart. The row id is a hash of the key: writing the same re-score twice leaves one row
(idempotent, so a killed re-score resumes by skipping what is there), and nothing is ever overwritten.

Rows carry ``ingest_seq`` from the store's one counter, so an export pinned to a watermark reads the same re-scores
forever. The writes go straight to the database in one transaction per batch (a re-score is a batch job, like the
CLIs that open the store without a journal); the table knows nothing of who computes the numbers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from ._column_types import JsonType, UTCDateTime, utcnow
from ._errors import InvalidRecord
from ._schema import Base
from ._tokens import pack_logprobs, unpack_logprobs
from ._write.db_apply import insert_ignore, reserve_seqs


class Rescore(Base):
    """A call's completion logprobs under ``policy_version_id`` as ``scorer`` computed them (append-only)."""

    __tablename__ = "rescores"
    __table_args__ = (sa.Index("ix_rescores_version_scorer", "policy_version_id", "scorer"),)
    id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    call_id: Mapped[str] = mapped_column(sa.String(128), nullable=False, index=True)
    rollout_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    policy_version_id: Mapped[str] = mapped_column(sa.String(128), nullable=False)
    scorer: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    scorer_lineage: Mapped[dict | None] = mapped_column(JsonType)
    n_tokens: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    logprobs: Mapped[bytes] = mapped_column(sa.LargeBinary, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ingest_seq: Mapped[int] = mapped_column(sa.BigInteger, nullable=False, index=True)


_T = Rescore.__table__
_CHUNK = 500


@dataclass(frozen=True)
class RescoreRow:
    call_id: str
    rollout_id: str | None
    policy_version_id: str
    scorer: str
    scorer_lineage: dict | None
    logprobs: list[float]
    ingest_seq: int = 0


def rescore_id(call_id: str, policy_version_id: str, scorer: str) -> str:
    return hashlib.sha256(f"{call_id}\x00{policy_version_id}\x00{scorer}".encode()).hexdigest()[:32]


def _check(row: RescoreRow) -> None:
    for name, most in (("call_id", 128), ("rollout_id", 128), ("policy_version_id", 128), ("scorer", 64)):
        value = getattr(row, name)
        if value is None and name == "rollout_id":
            continue
        if not isinstance(value, str) or not value or len(value) > most:
            raise InvalidRecord(f"re-score {name} {str(value)[:48]!r}: a non-empty string of at most {most} "
                                f"characters is required; pass the {name.replace('_', ' ')} as the store names it")
    if not row.logprobs:
        raise InvalidRecord(f"re-score of call {row.call_id!r}: no logprobs; a re-score holds one logprob per "
                            "completion token, so a call without completion tokens is not re-scored")
    bad = next((x for x in row.logprobs if not isinstance(x, (int, float)) or x != x or x > 0), None)
    if bad is not None:
        raise InvalidRecord(f"re-score of call {row.call_id!r}: logprob {bad!r} is not a number <= 0")


def record_rescores(store, rows: Iterable[RescoreRow]) -> int:
    """Write ``rows`` in one transaction; a row whose (call, version, scorer) is stored already is left as it is.
    Returns how many rows were new."""
    rows = list(rows)
    for r in rows:
        _check(r)
    if not rows:
        return 0
    ids = {rescore_id(r.call_id, r.policy_version_id, r.scorer): r for r in rows}
    with store.engine.begin() as conn:
        have = _present(conn, list(ids))
        new = [(i, r) for i, r in ids.items() if i not in have]
        if not new:
            return 0
        first, now = reserve_seqs(conn, len(new)), utcnow()
        insert_ignore(conn, _T, [dict(id=i, call_id=r.call_id, rollout_id=r.rollout_id,
                                      policy_version_id=r.policy_version_id, scorer=r.scorer,
                                      scorer_lineage=r.scorer_lineage, n_tokens=len(r.logprobs),
                                      logprobs=pack_logprobs(r.logprobs), created_at=now,
                                      ingest_seq=first + k) for k, (i, r) in enumerate(new)])
    return len(new)


def _present(conn: sa.Connection, ids: list[str]) -> set[str]:
    found: set[str] = set()
    for i in range(0, len(ids), _CHUNK):
        found.update(conn.execute(sa.select(_T.c.id).where(_T.c.id.in_(ids[i:i + _CHUNK]))).scalars())
    return found


def rescored_call_ids(store, policy_version_id: str, scorer: str, call_ids: Sequence[str]) -> set[str]:
    """Which of ``call_ids`` have a re-score under ``policy_version_id`` by ``scorer`` (what a resumed re-score
    skips)."""
    want = {rescore_id(c, policy_version_id, scorer): c for c in call_ids}
    with store.engine.connect() as conn:
        return {want[i] for i in _present(conn, list(want))}


def rescores(store, *, policy_version_id: str | None = None, scorer: str | None = None,
             call_ids: Sequence[str] | None = None, as_of: int | None = None) -> list[RescoreRow]:
    """Stored re-scores (every one, or of one version / scorer / some calls; ``as_of``: as of a watermark), in
    ingest order."""
    where = []
    if policy_version_id is not None:
        where.append(_T.c.policy_version_id == policy_version_id)
    if scorer is not None:
        where.append(_T.c.scorer == scorer)
    if as_of is not None:
        where.append(_T.c.ingest_seq <= as_of)
    q = sa.select(_T).order_by(_T.c.ingest_seq)
    out: list[RescoreRow] = []
    with store.engine.connect() as conn:
        if call_ids is None:
            chunks = [conn.execute(q.where(*where))]
        else:
            ids = list(call_ids)
            chunks = [conn.execute(q.where(*where, _T.c.call_id.in_(ids[i:i + _CHUNK])))
                      for i in range(0, len(ids), _CHUNK)]
        for result in chunks:
            out += [RescoreRow(r.call_id, r.rollout_id, r.policy_version_id, r.scorer, r.scorer_lineage,
                               unpack_logprobs(r.logprobs), r.ingest_seq) for r in result.mappings()]
    if call_ids is not None:
        out.sort(key=lambda r: r.ingest_seq)
    return out
