"""``erase``: remove a selection from every copy the store knows of, and leave a tombstone (DESIGN invariant 11).

The steps, each idempotent, in this order::

    plan       select the rollouts and calls; count what goes (a dry run stops here)
    record     one transaction: the tombstone (state "erasing"), the erased rollouts, the work list
    journals   blank erased records in every journal folder, delete erased dead letters
    database   one transaction: delete the rows; shared messages, tool schemas and blobs only if nothing kept
               references them (checked again inside the transaction)
    blobs      delete the freed blobs' bytes (local folder or s3://)
    snapshots  rewrite the snapshots and lake partitions the store recorded (and any named) without erased rows
    shards     list the exports whose watermark covered an erased rollout; delete their files with ``shards=True``
    done       the tombstone becomes "done" and the work list (which holds content hashes) is deleted

A run killed anywhere (``kill -9``) leaves the tombstone "erasing" with its work list: the next ``erase`` (or
``resume``) finishes it first, from the work list, to the same end state.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from . import _erase_copies as copies
from . import _schema as schema
from ._column_types import utcnow
from ._erase_select import (
    EV, EX, RS, RW, TASKS, TV, B, C, M, R, TS, Chosen, Selection, chunked, drop_kept, pattern_forms, select,
)
from ._tombstones import COPIES, ERASED, ITEMS, TOMBSTONES, tombstones
from ._write.db_apply import insert_ignore

log = logging.getLogger("forge_store.erase")
SEARCH = schema.CallSearch.__table__  # the search index's text of each call (SQLite's FTS5 follows by trigger)
STEPS = ("record", "journals", "database", "blobs", "snapshots", "shards", "done")


@dataclass
class ErasureReport:
    tombstone_id: str | None
    applied: bool
    counts: dict
    shards: list[dict] = field(default_factory=list)   # {"export_id", "out_dir", "deleted"}
    copies: list[dict] = field(default_factory=list)    # {"url", "kind", "rows"} (None: gone)
    resumed: list[str] = field(default_factory=list)    # erasures left unfinished by a killed run, finished now


def _count(conn: sa.Connection, table: sa.Table, col: str, keys) -> int:
    return sum(conn.execute(sa.select(sa.func.count()).select_from(table).where(table.c[col].in_(chunk))).scalar_one()
               for chunk in chunked(keys))


def _counts(conn: sa.Connection, chosen: Chosen) -> dict:
    return {"rollouts": len(chosen.rollouts), "calls": len(chosen.calls),
            "rewards": _count(conn, RW, "rollout_id", chosen.rollouts),
            "events": _count(conn, EV, "rollout_id", chosen.rollouts),
            "exclusions": _count(conn, EX, "rollout_id", chosen.rollouts),
            "rescores": _count(conn, RS, "call_id", chosen.calls),
            "messages": len(chosen.messages), "tool_schemas": len(chosen.tool_schemas), "blobs": len(chosen.blobs),
            "tasks": len(chosen.tasks), "running": len(chosen.running)}


def _exports(conn: sa.Connection, seen: list[int]) -> list[dict]:
    """Exports whose watermark covered an erased rollout (they held it as a row or as an exclusion)."""
    if not seen:
        return []
    ex = schema.Export.__table__
    rows = conn.execute(sa.select(ex.c.id, ex.c.out_dir).where(ex.c.watermark >= min(seen)).order_by(ex.c.id))
    return [{"export_id": r.id, "out_dir": r.out_dir} for r in rows]


def erase(store, selection: Selection, *, reason: str, actor: str | None = None, apply: bool = False,
          shards: bool = False, extra_copies: tuple[str, ...] = (),
          step: Callable[[str], None] | None = None) -> ErasureReport:
    """Erase ``selection`` (``apply=False``: only count). ``extra_copies``: snapshot or lake URLs the store did not
    record. ``step(name)`` is called after each step (progress; tests kill the process there)."""
    if not reason.strip():
        raise copies.EraseError("an erasure says why: pass --reason (a licence withdrawn, a leaked key, retention)")
    if apply:
        _drain_journals(store)
    resumed = [t.id for t in tombstones(store) if t.state != "done"] if apply else []
    for tid in resumed:
        finish(store, tid, shards=shards, extra_copies=extra_copies, step=step)
    with store.engine.connect() as conn:
        chosen = select(conn, selection)
        counts = _counts(conn, chosen)
        exports = _exports(conn, [seq for _, seq in chosen.rollouts.values()])
    counts["exports"] = len(exports)
    if not apply:
        return ErasureReport(None, False, counts, shards=[{**e, "deleted": False} for e in exports],
                             copies=[{"url": u, "kind": k} for u, k in _copy_urls(store, extra_copies)],
                             resumed=resumed)
    if not chosen.rollouts and not chosen.calls and not chosen.tasks:
        return ErasureReport(None, True, counts, resumed=resumed)
    tid = _tombstone_id(selection, reason)
    with store.engine.begin() as conn:
        insert_ignore(conn, TOMBSTONES, [{
            "id": tid, "selection": selection.describe(), "reason": reason, "actor": actor or _actor(),
            "state": "erasing", "counts": counts, "created_at": utcnow(), "finished_at": None}])
        insert_ignore(conn, ERASED, [{"rollout_id": rid, "tombstone_id": tid, "group_id": g, "seen_seq": seq}
                                     for rid, (g, seq) in chosen.rollouts.items()])
        items = [{"tombstone_id": tid, "kind": k, "key": key} for k, keys in chosen.items().items() for key in keys]
        for i in range(0, len(items), 1000):
            insert_ignore(conn, ITEMS, items[i:i + 1000])
    _step(step, "record")
    # the pattern is never stored (it is the secret): a resumed run blanks journal records by the work list alone
    forms = pattern_forms(selection.pattern) if selection.pattern is not None else None
    return finish(store, tid, shards=shards, extra_copies=extra_copies, step=step, resumed=resumed, forms=forms)


def _drain_journals(store) -> None:
    """Drain every journal no running writer holds, so the selection sees every row they hold."""
    from ._store import open_store
    from ._write.journal_files import JournalLocked

    s = store.settings
    if s.journal_dir is not None:
        return   # one shared journal folder: its owner drains it
    url = store.engine.url.render_as_string(hide_password=False)
    for d in copies.journal_dirs(Path(s.home), None):
        try:
            other = open_store(url, journal=True, name=d.name, settings=s, blobs=store.blobs)
        except JournalLocked:
            continue
        try:
            other.flush(60)
        finally:
            other.close(timeout=5)


def _tombstone_id(selection: Selection, reason: str) -> str:
    return hashlib.sha256(f"{uuid.uuid4().hex}|{reason}".encode()).hexdigest()[:32]


def _actor() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _step(step, name: str) -> None:
    log.info("erase: %s done", name)
    if step is not None:
        step(name)


def _copy_urls(store, extra: tuple[str, ...]) -> list[tuple[str, str]]:
    with store.engine.connect() as conn:
        known = [(r.url, r.kind) for r in conn.execute(sa.select(COPIES).order_by(COPIES.c.url))]
    seen = {u for u, _ in known}
    for url in extra:
        if url not in seen:
            kind = "lake" if copies.open_location(url, store.settings).list("_snapshots/") else "snapshot"
            known.append((url, kind))
    return known


def finish(store, tid: str, *, shards: bool = False, extra_copies: tuple[str, ...] = (),
           step: Callable[[str], None] | None = None, resumed: list[str] | None = None,
           forms: list[str] | None = None) -> ErasureReport:
    """Run (again) every step after ``record`` of the erasure ``tid``, from its work list."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(ITEMS.c.kind, ITEMS.c.key).where(ITEMS.c.tombstone_id == tid)).all()
        t = conn.execute(sa.select(TOMBSTONES).where(TOMBSTONES.c.id == tid)).mappings().one()
        seen = list(conn.execute(sa.select(ERASED.c.seen_seq).where(ERASED.c.tombstone_id == tid)).scalars())
    items: dict[str, set[str]] = {}
    for kind, key in rows:
        items.setdefault(kind, set()).add(key)
    keys = copies.Keys(items, forms)
    counts = dict(t["counts"] or {})
    s = store.settings
    for d in copies.journal_dirs(Path(s.home), s.journal_dir):
        got = copies.clean_journal(d, keys)
        for k, v in got.items():
            counts[k] = counts.get(k, 0) + v
    with store.engine.begin() as conn:   # kept now: a resumed run finds these records already blanked
        conn.execute(sa.update(TOMBSTONES).where(TOMBSTONES.c.id == tid).values(counts=counts))
    _step(step, "journals")
    _delete_rows(store.engine, tid, keys)
    _step(step, "database")
    with store.engine.connect() as conn:   # what the database step found still shared was taken off the list
        blobs = set(conn.execute(sa.select(ITEMS.c.key).where(ITEMS.c.tombstone_id == tid,
                                                               ITEMS.c.kind == "blob")).scalars())
    location = getattr(store.blobs, "location", None)
    if blobs and location is None:
        raise copies.EraseError(f"the blob store {type(store.blobs).__name__} cannot delete blobs; erase needs an "
                                "ObjectBlobStore (a folder or s3://, OPENFORGE_BLOB_URL), then a rerun finishes")
    for sha in sorted(blobs):
        location.delete(f"{sha[:2]}/{sha[2:4]}/{sha}")
    _step(step, "blobs")
    done_copies = []
    for url, kind in _copy_urls(store, extra_copies):
        clean = copies.clean_lake if kind == "lake" else copies.clean_snapshot
        got = clean(url, keys, tid, s)
        done_copies.append({"url": url, "kind": kind, **({"rows": got["rows"]} if got else {"rows": None})})
    _step(step, "snapshots")
    with store.engine.connect() as conn:
        exports = _exports(conn, seen)
    for e in exports:
        e["deleted"] = bool(shards and e["out_dir"]) and copies.delete_shards(e["out_dir"], s) > 0
    _step(step, "shards")
    counts["exports"] = len(exports)
    _compact(store.engine)   # before "done": a run killed while compacting compacts again when resumed
    with store.engine.begin() as conn:
        conn.execute(sa.delete(ITEMS).where(ITEMS.c.tombstone_id == tid))
        conn.execute(sa.update(TOMBSTONES).where(TOMBSTONES.c.id == tid).values(
            state="done", finished_at=utcnow(), counts=counts))
    _step(step, "done")
    return ErasureReport(tid, True, counts, shards=exports, copies=done_copies, resumed=resumed or [])


def _delete_rows(engine: sa.Engine, tid: str, keys: copies.Keys) -> None:
    """One transaction: the selected rows, then the content-addressed rows nothing kept references."""
    rollouts, calls, tasks = keys["rollout"], keys["call"], keys["task"]
    with engine.begin() as conn:
        for table, col, wanted in ((C, "id", calls), (C, "rollout_id", rollouts), (R, "id", rollouts),
                                   (RW, "rollout_id", rollouts), (EV, "rollout_id", rollouts),
                                   (EX, "rollout_id", rollouts), (EX, "call_id", calls), (RS, "call_id", calls),
                                   (RS, "rollout_id", rollouts), (TASKS, "id", tasks), (TV, "task_id", tasks),
                                   (SEARCH, "call_id", calls), (SEARCH, "rollout_id", rollouts)):   # + FTS5 rows
            for chunk in chunked(wanted):
                conn.execute(sa.delete(table).where(table.c[col].in_(chunk)))
        msgs, tools, blobs = set(keys["message"]), set(keys["tool_schema"]), set(keys["blob"])
        still = (set(msgs), set(tools), set(blobs))
        drop_kept(conn, msgs, tools, blobs, set(), set())   # every call left is kept
        for kind, before, after in (("message", still[0], msgs), ("tool_schema", still[1], tools),
                                    ("blob", still[2], blobs)):
            for chunk in chunked(before - after):   # a live rollout referenced it since the plan: it stays
                conn.execute(sa.delete(ITEMS).where(ITEMS.c.tombstone_id == tid, ITEMS.c.kind == kind,
                                                    ITEMS.c.key.in_(chunk)))
                keys.items[kind].difference_update(chunk)
        for table, wanted in ((M, msgs), (TS, tools), (B, blobs)):
            for chunk in chunked(wanted):
                conn.execute(sa.delete(table).where(table.c.sha256.in_(chunk)))


def _compact(engine: sa.Engine) -> None:
    """SQLite keeps deleted rows' bytes in free pages and its WAL: rewrite the file and empty the WAL, so the
    erased content is gone from the disk, not only from the tables. (On PostgreSQL a dump never holds deleted rows;
    their bytes stay in the table files until autovacuum reuses the space: run VACUUM FULL on the tables for that.)"""
    if engine.dialect.name != "sqlite":
        return
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql("VACUUM")
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")


def resume(store, **kw) -> list[ErasureReport]:
    """Finish every erasure a killed run left unfinished."""
    return [finish(store, t.id, **kw) for t in tombstones(store) if t.state != "done"]

