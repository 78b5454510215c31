"""Reads: rollouts, calls with their deltas resolved, rewards, events, lineage, for one rollout or many at once; all
optionally pinned to a watermark. Functions over a connection; ``Store`` calls them (``forge_store._store_reads``)."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import defaultdict
from collections.abc import Collection, Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from . import _schema as schema
from ._errors import NotFound, StoreError
from ._records import EventInfo, RewardInfo, RolloutFilter, RolloutInfo, StoredCall
from ._rewards import latest_rewards_query
from ._tokens import bytes_to_ids, unpack_ids_raw, unpack_logprobs
from ._write.db_apply import REFUSED_EVENT

_calls = schema.Call.__table__
_rollouts = schema.Rollout.__table__
_messages = schema.Message.__table__
_tools = schema.ToolSchema.__table__
_rewards = schema.Reward.__table__
_events = schema.Event.__table__
_exclusions = schema.Exclusion.__table__
log = logging.getLogger(__name__)


# the rollouts table's columns in RolloutInfo's field order: a row becomes a RolloutInfo positionally (a third of
# the time of a row mapping turned into keyword arguments, for the reads of whole stores)
_ROLLOUT_COLUMNS = [_rollouts.c[f.name] for f in dataclasses.fields(RolloutInfo)]


def _select_rollouts() -> sa.Select:
    return sa.select(*_ROLLOUT_COLUMNS)


def _rollout_info(row, as_of: int | None) -> RolloutInfo:
    info = RolloutInfo(*row)
    if as_of is not None and info.finished_seq is not None and info.finished_seq > as_of:
        # as of the watermark this rollout had not finished yet
        info = dataclasses.replace(info, status="running", outcome=None, outcome_detail=None, ended_at=None,
                                   finished_seq=None)
    return info


def rollout(conn: sa.Connection, rollout_id: str, as_of: int | None = None) -> RolloutInfo:
    q = _select_rollouts().where(_rollouts.c.id == rollout_id)
    if as_of is not None:
        q = q.where(_rollouts.c.ingest_seq <= as_of)
    row = conn.execute(q).first()
    if row is None:
        raise NotFound(f"rollout {rollout_id!r} is not in the store" + (f" as of watermark {as_of}" if as_of else ""))
    return _rollout_info(row, as_of)


def iter_rollouts(
    conn: sa.Connection, flt: RolloutFilter | None = None, as_of: int | None = None, chunk: int = 1000
) -> Iterator[RolloutInfo]:
    """Rollouts in ingest order, streamed in chunks (keyset pagination, bounded memory)."""
    flt = flt or RolloutFilter()
    last = -1
    while True:
        q = _select_rollouts().where(_rollouts.c.ingest_seq > last).order_by(_rollouts.c.ingest_seq).limit(chunk)
        if as_of is not None:
            q = q.where(_rollouts.c.ingest_seq <= as_of)
        for col in ("run_id", "group_id", "task_id", "policy_version_id"):
            if getattr(flt, col) is not None:
                q = q.where(_rollouts.c[col] == getattr(flt, col))
        rows = conn.execute(q).all()
        if not rows:
            return
        for row in rows:
            info = _rollout_info(row, as_of)
            if flt.outcome is not None and info.outcome != flt.outcome:
                continue
            if flt.finished is not None and (info.status == "finished") != flt.finished:
                continue
            yield info
        last = rows[-1].ingest_seq


def rollouts_by_id(conn: sa.Connection, rollout_ids: Sequence[str], as_of: int | None = None,
                   chunk: int = 500) -> dict[str, RolloutInfo]:
    """Rollout id -> its row as :func:`rollout` reads it, one query per ``chunk`` ids; ids not in the store (as of
    the watermark) are left out."""
    ids = list(dict.fromkeys(rollout_ids))
    out: dict[str, RolloutInfo] = {}
    for i in range(0, len(ids), chunk):
        q = _select_rollouts().where(ids_in(_rollouts.c.id, ids[i:i + chunk], conn.dialect.name == "postgresql"))
        if as_of is not None:
            q = q.where(_rollouts.c.ingest_seq <= as_of)
        out.update((row[0], _rollout_info(row, as_of)) for row in conn.execute(q))
    return out


def ids_in(column, values, pg: bool):
    """``column IN values`` as one bound value (a PostgreSQL array; a JSON list SQLite reads with json_each), so a
    query costs the same to build and send however many values it names."""
    values = list(values)
    if pg:
        return column == sa.any_(sa.bindparam(None, values, type_=postgresql.ARRAY(sa.Text)))
    return column.in_(sa.select(sa.func.json_each(json.dumps(values)).table_valued("value").c.value))


def load_bodies(conn: sa.Connection, table: sa.Table, hashes: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    todo = sorted(hashes)
    for i in range(0, len(todo), 500):
        part = todo[i : i + 500]
        out.update(conn.execute(sa.select(table.c.sha256, table.c.body).where(table.c.sha256.in_(part))).all())
    return out


Damage = dict  # rollout id -> [{"call_id", "seq", "why"}, ...]: what a read could not give back, and why


def calls(conn: sa.Connection, rollout_id: str, as_of: int | None = None,
          damage: Damage | None = None) -> list[StoredCall]:
    """A rollout's calls in order (seq, then id), prompts and token ids resolved in full. A call the store cannot
    give back (refused by the database, or stored as a delta on what is missing) is left out and reported: into
    ``damage`` when given (see :func:`calls_by_rollout`), else as a logged warning; the rest are returned."""
    return calls_by_rollout(conn, [rollout_id], as_of, damage=damage)[rollout_id]


def calls_by_rollout(conn: sa.Connection, rollout_ids: Sequence[str], as_of: int | None = None,
                     chunk: int = 500, damage: Damage | None = None) -> dict[str, list[StoredCall]]:
    """``calls`` of many rollouts, one query per ``chunk`` of them; a rollout without calls maps to [].

    ``damage``, when given, is filled with rollout id -> the calls that could not be read, each ``{"call_id",
    "seq", "why"}``: calls the database refused (the writer's ``call.refused`` events) and calls whose stored
    delta cannot be resolved (their base or a message body is missing)."""
    ids = list(dict.fromkeys(rollout_ids))
    out: dict[str, list[StoredCall]] = {rid: [] for rid in ids}
    found: Damage = defaultdict(list)
    for i in range(0, len(ids), chunk):
        part = ids[i:i + chunk]
        q = sa.select(_calls).where(_calls.c.rollout_id.in_(part))
        if as_of is not None:
            q = q.where(_calls.c.ingest_seq <= as_of)
        rows = {r.id: r for r in conn.execute(q.order_by(_calls.c.rollout_id, _calls.c.seq, _calls.c.id))}
        broken: dict[str, str] = {}
        for c in resolve_calls(conn, rows, broken):  # delta bases live in the same rollout, so in the same chunk
            out[c.rollout_id].append(c)
        for cid, why in broken.items():
            found[rows[cid].rollout_id].append({"call_id": cid, "seq": rows[cid].seq, "why": why})
        if damage is not None:
            refused_calls(conn, part, as_of, found)
    report_damage(found, damage)
    return out


def report_damage(found: Damage, damage: Damage | None) -> None:
    """Each rollout's unreadable calls in order, into ``damage`` when given, else as a logged warning."""
    for rid, items in found.items():
        items.sort(key=lambda d: (d["seq"] is None, d["seq"] or 0, d["call_id"]))
        if damage is not None:
            damage[rid] = items
        else:
            log.warning("rollout %s: %d call(s) cannot be read and are left out (first: %s: %s)", rid, len(items),
                        items[0]["call_id"], items[0]["why"])


def refused_calls(conn: sa.Connection, rollout_ids: list[str], as_of: int | None, found: Damage) -> None:
    """The calls of ``rollout_ids`` the database refused, from the writer's ``call.refused`` events."""
    q = sa.select(_events.c.rollout_id, _events.c.detail).where(
        _events.c.kind == REFUSED_EVENT, _events.c.rollout_id.in_(rollout_ids))
    if as_of is not None:
        q = q.where(_events.c.ingest_seq <= as_of)
    for rid, detail in conn.execute(q.order_by(_events.c.ingest_seq)):
        detail = detail or {}
        cid = detail.get("call_id")
        if any(d["call_id"] == cid for d in found[rid]):
            continue
        found[rid].append({"call_id": cid, "seq": detail.get("seq"),
                           "why": f"the database refused this call ({detail.get('error')}); it is kept in the "
                                  f"journal's dead-letter folder as {detail.get('dead_letter')}"})


def call(conn: sa.Connection, call_id: str) -> StoredCall:
    row = conn.execute(sa.select(_calls).where(_calls.c.id == call_id)).first()
    if row is None:
        raise NotFound(f"call {call_id!r} is not in the store")
    rows = {row.id: row}
    base = row.prompt_base_call_id or row.prompt_ids_base_call_id
    if base and row.rollout_id:  # bases live in the same rollout: resolve through it
        rows.update({r.id: r for r in conn.execute(sa.select(_calls).where(_calls.c.rollout_id == row.rollout_id))})
    broken: dict[str, str] = {}
    for c in resolve_calls(conn, rows, broken):
        if c.id == call_id:
            return c
    raise StoreError(f"call {call_id} cannot be read: {broken[call_id]}")


class _Unreadable(Exception):
    """A call whose stored delta cannot be resolved; the message says why."""


def resolve_deltas(rows: dict, bad: dict[str, str]) -> tuple[dict[str, list[str]], dict[str, bytes | None]]:
    """Each call's full prompt (message hashes) and full token ids (prompt + completion, raw uint32 LE bytes; None
    without prompt ids), resolved through the deltas of ``rows`` (call id -> row). A call whose delta cannot be
    resolved is named in ``bad`` (call id -> why) and has no entry in either map."""
    prompts: dict[str, list[str]] = {}
    full_ids: dict[str, bytes | None] = {}

    def check_base(base: str, what: str) -> None:
        if base not in rows:
            raise _Unreadable(f"its {what} is stored as a delta on call {base}, which is not in the store")
        if base not in bad:
            try:
                prompt_of(base)
                ids_of(base)
            except _Unreadable as exc:
                bad[base] = str(exc)
        if base in bad:
            raise _Unreadable(f"its {what} is stored as a delta on call {base}, which cannot be read")

    def prompt_of(cid: str) -> list[str]:
        if cid not in prompts:
            r = rows[cid]
            head: list[str] = []
            if r.prompt_base_call_id:
                check_base(r.prompt_base_call_id, "prompt")
                head = prompt_of(r.prompt_base_call_id)[: r.prompt_base_len]
            prompts[cid] = head + list(r.prompt_tail)
        return prompts[cid]

    def ids_of(cid: str) -> bytes | None:  # prompt + completion, raw uint32
        if cid not in full_ids:
            r = rows[cid]
            full = None
            if r.prompt_ids_tail is not None:
                base = b""
                if r.prompt_ids_base_call_id:
                    check_base(r.prompt_ids_base_call_id, "prompt token ids")
                    base = (ids_of(r.prompt_ids_base_call_id) or b"")[: r.prompt_ids_prefix_len * 4]
                prompt = base + unpack_ids_raw(r.prompt_ids_tail)
                full = prompt + (unpack_ids_raw(r.completion_ids) if r.completion_ids else b"")
            full_ids[cid] = full
        return full_ids[cid]

    for cid in rows:
        if cid in bad:
            continue
        try:
            prompt_of(cid)
            ids_of(cid)
        except _Unreadable as exc:
            bad[cid] = str(exc)
    return prompts, full_ids


def missing_message(prompt: list[str], present) -> str | None:
    """Why a call whose prompt is ``prompt`` (message hashes) cannot be read when only ``present`` bodies exist."""
    for h in prompt:
        if h not in present:
            return f"prompt message {h} is not in the messages table"
    return None


def resolve_calls(conn: sa.Connection, rows: dict, broken: dict[str, str] | None = None) -> list[StoredCall]:
    """``rows`` (call id -> row) with their prompt deltas resolved. A call that cannot be resolved is left out and
    named in ``broken`` (call id -> why); without ``broken`` the first such call raises ``StoreError``."""
    bad: dict[str, str] = {} if broken is None else broken
    prompts, full_ids = resolve_deltas(rows, bad)
    wanted = {h for cid, p in prompts.items() if cid not in bad for h in p}
    wanted |= {r.response_message_hash for r in rows.values() if r.response_message_hash}
    bodies = load_bodies(conn, _messages, wanted)
    tools = load_bodies(conn, _tools, {r.tool_schema_hash for r in rows.values() if r.tool_schema_hash})
    out = []
    for cid, r in rows.items():
        if cid in bad:
            continue
        why = missing_message(prompts[cid], bodies)
        if why:
            bad[cid] = why
            continue
        full = full_ids[cid]
        prompt_ids = None
        if full is not None:
            prompt_ids = bytes_to_ids(full[: r.n_prompt_tokens * 4])
        m = r._mapping
        out.append(
            StoredCall(
                id=cid, rollout_id=r.rollout_id, seq=r.seq, api_surface=r.api_surface, model=r.model,
                streamed=r.streamed, request_hash=r.request_hash, system_prompt_hash=r.system_prompt_hash,
                tool_schema_hash=r.tool_schema_hash, params=r.request_params or {},
                messages=[json.loads(bodies[h]) for h in prompts[cid]], message_hashes=prompts[cid],
                tools=json.loads(tools[r.tool_schema_hash]) if r.tool_schema_hash in tools else None,
                response=r.response, response_message_hash=r.response_message_hash, finish_reason=r.finish_reason,
                response_message=json.loads(bodies[r.response_message_hash])
                if r.response_message_hash in bodies else None,
                prompt_token_ids=prompt_ids,
                completion_token_ids=bytes_to_ids(unpack_ids_raw(r.completion_ids)) if r.completion_ids else (
                    [] if r.completion_ids is not None else None),
                completion_logprobs=unpack_logprobs(r.completion_logprobs), usage=r.usage,
                started_at=r.started_at, ended_at=r.ended_at, ttft_ms=r.ttft_ms, latency_ms=r.latency_ms,
                upstream_status=r.upstream_status, error_class=r.error_class, error_detail=r.error_detail,
                retry_of=r.retry_of, policy_version_id=r.policy_version_id, token_exact=r.token_exact,
                image_hashes=r.image_hashes, metadata=m["metadata"], ingest_seq=r.ingest_seq,
            )
        )
    if broken is None and bad:
        cid = next(iter(bad))
        raise StoreError(f"call {cid} cannot be read: {bad[cid]} (store damaged)")
    return out


def rewards(conn: sa.Connection, rollout_id: str, as_of: int | None = None) -> list[RewardInfo]:
    q = sa.select(_rewards).where(_rewards.c.rollout_id == rollout_id)
    if as_of is not None:
        q = q.where(_rewards.c.ingest_seq <= as_of)
    return [RewardInfo(**r._mapping) for r in conn.execute(q.order_by(_rewards.c.ingest_seq))]


def latest_rewards(conn: sa.Connection, rollout_ids: Sequence[str], sources: Collection[str] | None = None,
                   as_of: int | None = None, chunk: int = 500) -> dict[str, RewardInfo]:
    """Rollout id -> the reward that counts (:mod:`forge_store._rewards`); rollouts without one are left out."""
    ids = list(dict.fromkeys(rollout_ids))
    out: dict[str, RewardInfo] = {}
    for i in range(0, len(ids), chunk):
        lr = latest_rewards_query(sources=sources, as_of=as_of, rollout_ids=ids[i:i + chunk])
        rows = conn.execute(sa.select(*[lr.c[f.name] for f in dataclasses.fields(RewardInfo)]))
        out.update((r[1], RewardInfo(*r)) for r in rows)  # columns in RewardInfo's order (rollout_id second)
    return out


def exclusion_reasons(conn: sa.Connection, rollout_ids: Sequence[str] | None = None) -> dict[str, set[str]]:
    """Rollout id -> the reasons it was excluded for (by any export); rollouts never excluded are left out."""
    q = sa.select(_exclusions.c.rollout_id, _exclusions.c.reason).where(_exclusions.c.rollout_id.is_not(None))
    if rollout_ids is not None:
        ids = list(dict.fromkeys(rollout_ids))
        parts = [q.where(_exclusions.c.rollout_id.in_(ids[i:i + 500])) for i in range(0, len(ids), 500)]
    else:
        parts = [q]
    out: dict[str, set[str]] = defaultdict(set)
    for part in parts:
        for rid, reason in conn.execute(part):
            out[rid].add(reason)
    return dict(out)


def events(conn: sa.Connection, rollout_id: str, as_of: int | None = None) -> list[EventInfo]:
    q = sa.select(_events).where(_events.c.rollout_id == rollout_id)
    if as_of is not None:
        q = q.where(_events.c.ingest_seq <= as_of)
    return [EventInfo(**r._mapping) for r in conn.execute(q.order_by(_events.c.time, _events.c.ingest_seq))]


_LINEAGE = {t.__tablename__: t.__table__ for t in (schema.Task, schema.TaskVersion, schema.Harness, schema.PolicyVersion,
                                                  schema.RolloutGroup, schema.Run, schema.Exclusion, schema.Export)}


def lineage(conn: sa.Connection, kind: str, as_of: int | None = None,
            ids: Sequence[str] | None = None) -> list[dict]:
    """Every row of a small lineage table, in ingest order, as plain dicts (``meta`` comes back as ``metadata``);
    with ``ids``, only the rows of those ids."""
    if kind not in _LINEAGE:
        raise StoreError(f"lineage table {kind!r} unknown: use one of {', '.join(_LINEAGE)}")
    table = _LINEAGE[kind]
    q = sa.select(table).order_by(table.c.ingest_seq)
    if as_of is not None:
        q = q.where(table.c.ingest_seq <= as_of)
    if ids is not None:
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return []
        q = q.where(ids_in(table.c.id, wanted, conn.dialect.name == "postgresql"))
    return [dict(r._mapping) for r in conn.execute(q)]

