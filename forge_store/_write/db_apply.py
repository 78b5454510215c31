"""Apply journaled write operations to the database: one transaction per batch, idempotent by id.

An operation is a dict ``{"k": kind, "r": row, ...}`` exactly as it sits in the journal. Replaying an operation
that already landed changes nothing (``INSERT ... ON CONFLICT DO NOTHING``; a rollout's finish only applies to a
rollout not yet finished), so the writer may re-apply any suffix of the journal after a crash.

``apply_ops`` turns a batch into SQL inside the caller's transaction; ``BatchApplier`` owns the transactions: it
retries while the database is unreachable and dead-letters an operation the database refuses for good. Both
writers' database sides (``thread_writer``'s thread, ``drain_process``) apply through it.

A refused call must not take its rollout down with it. The encoder stored every later call of the rollout as a
delta on it (it journaled them before the database said no), so ``BatchApplier`` repairs what it can, in the
database side, where the refusal is known: it keeps the refused call's delta (in memory, and read back from the
dead-letter folder when a writer starts) and re-anchors each later call that names it as a base onto the refused
call's own base, moving the shared part of the refused call's prompt into the later call's tail (still a delta,
not a full copy); it stores the refused call's message, tool and answer bodies (content-addressed, other calls
name them) and an event ``call.refused`` (source ``store``; detail: call id, seq, error, dead-letter file) that
readers report as damage (``Store.calls(..., damage=...)``). What cannot be repaired (a body the database refuses,
a dead letter of an older writer) is reported by the reads as damage too, never as a failed read.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from .. import _schema as schema
from .._backoff import Backoff
from .._errors import InvalidRecord
from .._hashing import canonical_json, sha256_hex
from .._tokens import compress_packed, ids_to_bytes, pack_ids, pack_logprobs, text_to_raw, unpack_ids_raw
from .journal_files import write_private
from .op_codec import pack_op, unpack_op
from .search_index import index_calls

log = logging.getLogger(__name__)

# What says "the database is away" rather than "the database refuses this": retried, never dead-lettered.
TRANSIENT = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DisconnectionError, sa.exc.TimeoutError)

TABLES: dict[str, sa.Table] = {
    "task": schema.Task.__table__,
    "task_version": schema.TaskVersion.__table__,
    "harness": schema.Harness.__table__,
    "policy_version": schema.PolicyVersion.__table__,
    "run": schema.Run.__table__,
    "group": schema.RolloutGroup.__table__,
    "blob": schema.Blob.__table__,
    "rollout_start": schema.Rollout.__table__,
    "call": schema.Call.__table__,
    "reward": schema.Reward.__table__,
    "event": schema.Event.__table__,
    "exclusion": schema.Exclusion.__table__,
    "export": schema.Export.__table__,
}
# Dependency order inside one batch: rows that others point at first, rollout finishes last.
ORDER = (*TABLES, "rollout_finish")

_counter = schema.IngestCounter.__table__
_messages = schema.Message.__table__
_tool_schemas = schema.ToolSchema.__table__
_rollouts = schema.Rollout.__table__

REFUSED_EVENT = "call.refused"  # the event a refused call leaves in its rollout (kind; source "store")
FINISH_FIELDS = ("outcome", "outcome_detail", "ended_at", "image_digest", "pod_name", "node_name")
_LIMITS = {kind: schema.Limits(table) for kind, table in {**TABLES, "rollout_finish": _rollouts}.items()}


def check_lengths(op: dict) -> None:
    """InvalidRecord for a value its column cannot hold on PostgreSQL (see ``schema.Limits``)."""
    limits = _LIMITS.get(op["k"])
    if limits is not None:
        noun = "rollout" if op["k"] in ("rollout_start", "rollout_finish") else op["k"].replace("_", " ")
        limits.check(noun, (op.get("r") or {}).get)


# Statements built once per (dialect, table) and reused by every batch instead of built anew for each of a batch's
# tables (SQLAlchemy caches the compiled form either way; this saves constructing the statement and its cache key;
# the saving is not measured apart). Keyed by the Table itself: two tables may share a name in other schemas.
_INSERTS: dict[tuple[str, sa.Table], sa.Insert] = {}


def insert_ignore(conn: sa.Connection, table: sa.Table, rows: list[dict]) -> None:
    if not rows:
        return
    key = (conn.dialect.name, table)
    stmt = _INSERTS.get(key)
    if stmt is None:
        dialect = postgresql if key[0] == "postgresql" else sqlite
        stmt = _INSERTS[key] = dialect.insert(table).on_conflict_do_nothing()
    conn.execute(stmt, _same_keys(table, rows))


def _same_keys(table: sa.Table, rows: list[dict]) -> list[dict]:
    """Every row of one executemany with the same keys (SQLAlchemy builds the statement from the first row and
    refuses a later row that lacks one of its keys): a missing key gets its column's scalar default, else None."""
    keys = set().union(*rows)
    if all(len(r) == len(keys) for r in rows):
        return rows
    fill = {k: (c.default.arg if c.default is not None and c.default.is_scalar else None)
            for k in keys for c in (table.c[k],)}
    return [r if len(r) == len(keys) else {**fill, **r} for r in rows]


_RESERVE = (sa.update(_counter).where(_counter.c.id == 1).values(value=_counter.c.value + sa.bindparam("n"))
            .returning(_counter.c.value))


def reserve_seqs(conn: sa.Connection, n: int) -> int:
    """Take ``n`` ingest sequence numbers; return the first. Holds the counter's row lock until commit."""
    return conn.execute(_RESERVE, {"n": n}).scalar_one() - n + 1


def apply_ops(conn: sa.Connection, ops: list[dict]) -> None:
    """Write ``ops`` in one transaction (the caller's)."""
    first = reserve_seqs(conn, len(ops))
    rows: dict[str, list[dict]] = defaultdict(list)
    messages: dict[str, dict] = {}
    tool_schemas: dict[str, dict] = {}
    calls: list[tuple[dict, dict]] = []
    for i, op in enumerate(ops):
        kind, seq = op["k"], first + i
        if kind == "erased":  # a record an erasure blanked in place (forge_store._erase_copies)
            continue
        if kind == "msgs":  # a call's new message and tool bodies, journaled ahead of it (see CallEncoder.ahead)
            _bodies(op, seq, messages, tool_schemas)
            continue
        if kind == "rollout_finish":
            rows[kind].append({**op["r"], "finished_seq": seq})
            continue
        row = {**op["r"], "ingest_seq": seq}
        rows[kind].append(row)
        if kind == "call":
            _call(op, row, seq, messages)
            _bodies(op, seq, messages, tool_schemas)
            calls.append((op, row))
    insert_ignore(conn, _messages, list(messages.values()))
    insert_ignore(conn, _tool_schemas, list(tool_schemas.values()))
    for kind in ORDER:
        if kind == "rollout_finish":
            _finish_rollouts(conn, rows[kind])
        else:
            insert_ignore(conn, TABLES[kind], rows[kind])
    index_calls(conn, calls, messages, insert_ignore)


def _call(op: dict, row: dict, seq: int, messages: dict[str, dict]) -> None:
    """What the proxy's loop leaves to this side: token arrays are journaled raw (prompt ids as bytes or text,
    completion ids and logprobs as lists) and packed here; the answer message is journaled as it came and its
    canonical body and hash are made here."""
    row["prompt_ids_tail"] = compress_packed(row.get("prompt_ids_tail"))
    done = row.get("completion_ids")
    try:
        row["completion_ids"] = compress_packed(done) if done is None or isinstance(done, bytes) else pack_ids(done)
        logprobs = row.get("completion_logprobs")
        if logprobs is not None and not isinstance(logprobs, bytes):
            row["completion_logprobs"] = pack_logprobs(logprobs)
    except (TypeError, ValueError) as exc:  # an id outside uint32 (InvalidRecord is a ValueError), a non-number
        raise InvalidRecord(f"call {row.get('id')}: completion token ids or logprobs cannot be stored "
                            f"({exc})") from None
    answer = op.get("resp")
    if answer is not None:
        try:
            body = canonical_json(answer).decode()
        except ValueError as exc:
            raise InvalidRecord(f"call {row.get('id')}: answer message is not storable JSON ({exc})") from None
        sha = row["response_message_hash"] = sha256_hex(body.encode())
        messages.setdefault(sha, {"sha256": sha, "role": answer.get("role"), "body": body, "size": len(body),
                                  "ingest_seq": seq})


def _bodies(op: dict, seq: int, messages: dict[str, dict], tool_schemas: dict[str, dict]) -> None:
    for sha, (role, body) in (op.get("msgs") or {}).items():
        messages.setdefault(sha, {"sha256": sha, "role": role, "body": body, "size": len(body), "ingest_seq": seq})
    if op.get("tools"):
        sha, body = op["tools"]
        tool_schemas.setdefault(sha, {"sha256": sha, "body": body, "ingest_seq": seq})


def _finish_rollouts(conn: sa.Connection, finishes: list[dict]) -> None:
    """The first finish of a rollout wins; a finish for a rollout never started creates its row."""
    for f in finishes:
        stub = {k: v for k, v in f.items() if k not in ("finished_seq",)}
        stub.update(status="running", ingest_seq=f["finished_seq"])
        stub.setdefault("started_at", f["ended_at"])
        insert_ignore(conn, _rollouts, [stub])
        values = {k: f[k] for k in FINISH_FIELDS if f.get(k) is not None}
        values.update(status="finished", finished_seq=f["finished_seq"])
        conn.execute(
            sa.update(_rollouts)
            .where(_rollouts.c.id == f["id"], _rollouts.c.finished_seq.is_(None))
            .values(**values)
        )


def _ids_raw(tail: bytes | None) -> bytes:
    """uint32 LE bytes of a journaled prompt-ids tail (``b"I"`` raw, ``b"Z"`` compressed, ``b"T"`` id text)."""
    if tail is None:
        return b""
    return text_to_raw(bytes(tail[1:])) if tail[:1] == b"T" else unpack_ids_raw(bytes(tail))


def _completion_raw(done) -> bytes:
    if done is None:
        return b""
    return unpack_ids_raw(bytes(done)) if isinstance(done, (bytes, bytearray)) else ids_to_bytes(done)


def reanchor(row: dict, refused: Mapping[str, dict]) -> dict | None:
    """A call's row (journal form) with its prompt deltas moved off refused calls (``refused``: call id -> its
    row); None when neither of its bases was refused. A prompt that shares ``k`` items with refused call R, whose
    own prompt shares ``l`` with its base B, shares ``min(k, l)`` with B; R's tail up to ``k`` moves into the row's
    tail (for ids: R's prompt tail + completion, which the row's prompt extends). InvalidRecord where R's ids cannot
    be read back (what made R unstorable is then in this prompt too)."""
    if row.get("prompt_base_call_id") not in refused and row.get("prompt_ids_base_call_id") not in refused:
        return None
    row = dict(row)
    while row.get("prompt_base_call_id") in refused:
        r, k = refused[row["prompt_base_call_id"]], row["prompt_base_len"]
        base = r.get("prompt_base_call_id")
        shared = r.get("prompt_base_len") or 0 if base else 0
        row["prompt_base_call_id"] = base if min(k, shared) else None
        row["prompt_base_len"] = min(k, shared)
        if k > shared:
            row["prompt_tail"] = list(r["prompt_tail"][:k - shared]) + list(row["prompt_tail"])
    while row.get("prompt_ids_base_call_id") in refused:
        r, k = refused[row["prompt_ids_base_call_id"]], row["prompt_ids_prefix_len"]
        base = r.get("prompt_ids_base_call_id")
        shared = r.get("prompt_ids_prefix_len") or 0 if base else 0
        row["prompt_ids_base_call_id"] = base if min(k, shared) else None
        row["prompt_ids_prefix_len"] = min(k, shared)
        if k > shared:
            past = _ids_raw(r.get("prompt_ids_tail")) + _completion_raw(r.get("completion_ids"))
            if len(past) < (k - shared) * 4:
                raise InvalidRecord(f"call {row.get('id')}: its prompt ids extend refused call {r.get('id')}, "
                                    "whose ids are too short to re-anchor them")
            row["prompt_ids_tail"] = b"I" + past[:(k - shared) * 4] + _ids_raw(row.get("prompt_ids_tail"))
    return row


def _salvage(op: dict) -> dict | None:
    """The message, tool and answer bodies a refused call carried, as a ``msgs`` operation of their own."""
    msgs = dict(op.get("msgs") or {})
    answer = op.get("resp")
    if isinstance(answer, dict):
        try:
            body = canonical_json(answer).decode()
            msgs.setdefault(sha256_hex(body.encode()), (answer.get("role"), body))
        except ValueError:
            pass  # the answer itself is what cannot be stored: a later prompt holding it reads as damaged
    if not msgs and not op.get("tools"):
        return None
    return {"k": "msgs", "msgs": msgs, **({"tools": op["tools"]} if op.get("tools") else {})}


def _refusal(exc: BaseException) -> str:
    """What the database said, short, without the statement or its parameters (they hold the data)."""
    cause = getattr(exc, "orig", None) or exc
    return f"{type(cause).__name__}: {str(cause).splitlines()[0][:300] if str(cause) else ''}"


class BatchApplier:
    """Applies batches of operations in one transaction each: while the database is unreachable it retries with
    back-off (``wait(delay)`` sleeps and says whether to go on); an operation the database rejects for good is
    isolated by halving the batch and kept in ``dead_letter_dir``, so one bad row never blocks or drops the rest.
    A refused call is remembered (``max_refused`` of them, the newest dead letters on disk included) so the later
    calls of its rollout are re-anchored past it (see the module docstring)."""

    def __init__(self, dead_letter_dir: Path, retry_max_s: float, max_refused: int = 4096):
        self.dead_letter_dir, self.retry_max_s, self.max_refused = dead_letter_dir, retry_max_s, max_refused
        self.db_down_since: float | None = None
        self.dead_letters = 0
        self.refused: OrderedDict[str, dict] = OrderedDict()
        for path in sorted(dead_letter_dir.glob("*-call.msgpack"))[-max_refused:] if dead_letter_dir.is_dir() else ():
            try:
                row = unpack_op(path.read_bytes()).get("r") or {}
            except (OSError, ValueError) as exc:
                log.warning("dead letter %s cannot be read back (%s); calls based on it may read as damaged", path, exc)
                continue
            if row.get("id"):
                self._remember(row)

    def _remember(self, row: dict) -> None:
        self.refused[row["id"]] = row
        self.refused.move_to_end(row["id"])
        while len(self.refused) > self.max_refused:
            self.refused.popitem(last=False)

    def _reanchored(self, op: dict) -> dict:
        if op.get("k") != "call" or not self.refused:
            return op
        row = reanchor(op["r"], self.refused)
        return op if row is None else {**op, "r": row}

    def apply(self, engine: sa.Engine, ops: list[dict], wait: Callable[[float], bool]) -> bool:
        """True once ``ops`` are in the database (or dead-lettered); False if ``wait`` said to give up."""
        try:
            ops = [self._reanchored(op) for op in ops]
            return self._commit(engine, ops, wait)
        except (sa.exc.DBAPIError, InvalidRecord) as exc:  # the database refused it, or a value cannot be stored
            if len(ops) == 1:
                return self._dead_letter(engine, ops[0], exc, wait)
            mid = len(ops) // 2  # find the poison operation, keep the rest
            return self.apply(engine, ops[:mid], wait) and self.apply(engine, ops[mid:], wait)

    def _commit(self, engine: sa.Engine, ops: list[dict], wait: Callable[[float], bool]) -> bool:
        """``ops`` in one transaction, retried while the database is away; raises what the database refuses."""
        delays = Backoff(0.05, self.retry_max_s)
        while True:
            try:
                with engine.begin() as conn:
                    apply_ops(conn, ops)
                if self.db_down_since is not None:
                    log.warning("database is back after %.1fs; draining the journal",
                                time.monotonic() - self.db_down_since)
                    self.db_down_since = None
                return True
            except TRANSIENT as exc:
                if self.db_down_since is None:
                    self.db_down_since = time.monotonic()
                    log.warning("database unreachable (%s); writes stay in the journal and will drain",
                                exc.__class__.__name__)
                if not wait(delays.next()):
                    return False

    def _dead_letter(self, engine: sa.Engine, op: dict, exc: BaseException, wait: Callable[[float], bool]) -> bool:
        """An operation the database rejects for good: keep it on disk, loudly, rather than block or drop it. For a
        call, also remember it (re-anchoring) and store what can be stored: its bodies and a ``call.refused``
        event."""
        path = self.dead_letter_dir / f"{time.time_ns()}-{op.get('k')}.msgpack"
        write_private(path, pack_op(op))  # owner-only, like the journal it comes from
        self.dead_letters += 1
        log.error("database rejected a %s write (%s); kept in %s for inspection", op.get("k"), _refusal(exc), path)
        if op.get("k") != "call" or not (op.get("r") or {}).get("id"):
            return True
        row = op["r"]
        self._remember(row)
        event = {"k": "event", "r": {
            "id": hashlib.sha256(f"{REFUSED_EVENT}|{row['id']}".encode()).hexdigest()[:32],
            "rollout_id": row.get("rollout_id"), "kind": REFUSED_EVENT, "source": "store", "time": schema.utcnow(),
            "detail": {"call_id": row["id"], "seq": row.get("seq"), "error": _refusal(exc), "dead_letter": path.name}}}
        for extra in (_salvage(op), event):
            if extra is None:
                continue
            try:
                if not self._commit(engine, [extra], wait):
                    return False  # closing: the journal replays the call, which is refused again and salvaged then
            except (sa.exc.DBAPIError, InvalidRecord) as again:
                log.error("what a refused call %s left (%s) cannot be stored either (%s); reads of its rollout "
                          "report the damage", row["id"], extra["k"], _refusal(again))
        return True
