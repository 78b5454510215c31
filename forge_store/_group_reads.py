"""Reads of a store group by group, for readers that walk a whole store (an export's plan): how many rollouts
each group has (one aggregate query, not a row per rollout), then the rollouts of a run of groups when it comes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence

import sqlalchemy as sa

from . import _schema as schema
from ._reads import _rollout_info, _select_rollouts, ids_in
from ._records import RolloutInfo

_rollouts = schema.Rollout.__table__


def group_index(conn: sa.Connection, as_of: int | None = None) -> Iterator[tuple]:
    """(group id, rollout id, finished, rollouts) as of the watermark: one row per group (rollout id None) and one
    per rollout without a group (group id None or empty), with how many of its rollouts had finished (as
    :func:`_rollout_info` reads a rollout that finished after the watermark: not finished) and how many there
    were. What a reader of a whole store keeps of it (an export's plan) in one aggregate query, instead of a row
    per rollout; rows in no particular order."""
    loose = sa.or_(_rollouts.c.group_id.is_(None), _rollouts.c.group_id == "")
    done = _rollouts.c.status == "finished"
    if as_of is not None:
        done = sa.and_(done, sa.or_(_rollouts.c.finished_seq.is_(None), _rollouts.c.finished_seq <= as_of))
    rid = sa.case((loose, _rollouts.c.id), else_=sa.null()).label("rid")
    group = sa.case((loose, sa.null()), else_=_rollouts.c.group_id).label("gid")
    q = sa.select(group, rid, sa.func.sum(sa.case((done, 1), else_=0)), sa.func.count()).group_by(group, rid)
    if as_of is not None:
        q = q.where(_rollouts.c.ingest_seq <= as_of)
    for gid, rollout_id, finished, n in conn.execute(q):
        yield gid, rollout_id, int(finished or 0), int(n)


def group_rollouts(conn: sa.Connection, group_ids: Sequence[str], as_of: int | None = None,
                   chunk: int = 500) -> dict[str, list[RolloutInfo]]:
    """Group id -> its rollouts as :func:`rollout` reads them (as of the watermark), in id order; one query per
    ``chunk`` groups. Groups without rollouts are left out."""
    ids = list(dict.fromkeys(group_ids))
    out: dict[str, list[RolloutInfo]] = defaultdict(list)
    for i in range(0, len(ids), chunk):
        q = _select_rollouts().where(ids_in(_rollouts.c.group_id, ids[i:i + chunk], conn.dialect.name == "postgresql"))
        if as_of is not None:
            q = q.where(_rollouts.c.ingest_seq <= as_of)
        for row in conn.execute(q):
            info = _rollout_info(row, as_of)
            out[info.group_id].append(info)
    for infos in out.values():
        infos.sort(key=lambda info: info.id)
    return dict(out)
