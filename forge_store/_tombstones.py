"""Tombstones: what an erasure removed, never the content it removed (DESIGN invariant 11).

Four bookkeeping tables, none of them copied into snapshots or the lake (``NOT_COPIED``):

- ``tombstones``: one row per erasure: its selection (the selector as given: ids, a time range, a pattern's sha256
  and length, never the pattern), why, by whom, when, its counts and its state (``erasing`` until every copy is
  done, then ``done``). A pattern is itself the secret, so only its hash is kept.
- ``erased_rollouts``: each erased rollout's id, group and the ingest sequence number it had, so an export pinned
  to a watermark knows which rollouts it would have seen (a re-export records an ``erased`` exclusion for each, and
  ``verify`` of an export that held one names the erasure).
- ``erasure_items``: the work list of an erasure in progress (calls, messages, tool schemas, blobs, tasks by id or
  hash); it is what makes an erasure resumable after ``kill -9``, and it is deleted when the erasure is done.
- ``store_copies``: where snapshots and lakes of this store were written (``store snapshot`` / ``store lake``
  record it), so an erasure finds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from ._column_types import JsonType, UTCDateTime, utcnow
from ._schema import Base
from ._write.db_apply import insert_ignore

NOT_COPIED = ("tombstones", "erased_rollouts", "erasure_items", "store_copies")


class Tombstone(Base):
    __tablename__ = "tombstones"
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    selection: Mapped[dict] = mapped_column(JsonType, nullable=False)
    reason: Mapped[str] = mapped_column(sa.Text, nullable=False)
    actor: Mapped[str] = mapped_column(sa.String(128), nullable=False)
    state: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    counts: Mapped[dict | None] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ErasedRollout(Base):
    __tablename__ = "erased_rollouts"
    rollout_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    tombstone_id: Mapped[str] = mapped_column(sa.String(64), nullable=False, index=True)
    group_id: Mapped[str | None] = mapped_column(sa.String(128))
    seen_seq: Mapped[int] = mapped_column(sa.BigInteger, nullable=False, index=True)  # the rollout's ingest_seq


class ErasureItem(Base):
    __tablename__ = "erasure_items"
    tombstone_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    key: Mapped[str] = mapped_column(sa.String(128), primary_key=True)


class StoreCopy(Base):
    __tablename__ = "store_copies"
    url: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


TOMBSTONES, ERASED, ITEMS, COPIES = (Tombstone.__table__, ErasedRollout.__table__, ErasureItem.__table__,
                                      StoreCopy.__table__)


@dataclass(frozen=True)
class TombstoneInfo:
    id: str
    selection: dict
    reason: str
    actor: str
    state: str
    counts: dict
    created_at: datetime
    finished_at: datetime | None

    def describe(self) -> str:
        """One line naming the erasure (for errors and ``verify``)."""
        return (f"erasure {self.id} ({self.created_at:%Y-%m-%d %H:%M} UTC by {self.actor}: {self.reason}; "
                f"{self.counts.get('rollouts', 0)} rollouts)")


def record_copy(engine: sa.Engine, url: str, kind: str) -> None:
    """Remember that a snapshot or lake of this store lives at ``url`` (idempotent)."""
    with engine.begin() as conn:
        insert_ignore(conn, COPIES, [{"url": url, "kind": kind, "created_at": utcnow()}])


def tombstones(store) -> list[TombstoneInfo]:
    """Every erasure, oldest first."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(TOMBSTONES).order_by(TOMBSTONES.c.created_at, TOMBSTONES.c.id)).mappings()
        return [TombstoneInfo(r["id"], r["selection"], r["reason"], r["actor"], r["state"], r["counts"] or {},
                              r["created_at"], r["finished_at"]) for r in rows]


def erased_rollouts(store, *, as_of: int | None = None) -> dict[str, tuple[str | None, str]]:
    """Rollout id -> (its group, the erasure that removed it), for rollouts the store held at ``as_of``."""
    q = sa.select(ERASED.c.rollout_id, ERASED.c.group_id, ERASED.c.tombstone_id)
    if as_of is not None:
        q = q.where(ERASED.c.seen_seq <= as_of)
    with store.engine.connect() as conn:
        return {r.rollout_id: (r.group_id, r.tombstone_id) for r in conn.execute(q)}
