"""Token-level calls of many rollouts at once (:class:`TokenCall`): what a veRL / TRL export reads.

``calls_by_rollout`` gives each call its whole prompt as decoded messages and its token ids as Python ints: for a
rollout of T turns that is O(T^2) JSON decoding and int boxing, right for one trajectory and slow for a store.
A token-level shard needs each call's token arrays, its logprobs and the few facts the selection rules read, and
the prompt messages of a rollout's first call only (a group's prompt row). This reads those columns for a chunk of
rollouts in one query, resolves the prompt-id deltas on raw bytes (``_reads.resolve_deltas``, the same code
``calls_by_rollout`` uses), and leaves arrays as raw little-endian bytes, which numpy views without a copy. Which
calls cannot be read, and why, is decided exactly as ``calls_by_rollout`` decides it (a delta whose base is gone,
a prompt message whose body is gone: that check reads the hashes, never the bodies; calls the database refused).
"""

from __future__ import annotations

import json
from array import array
from collections import defaultdict, namedtuple
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import sqlalchemy as sa

from . import _reads as reads
from . import _schema as schema
from ._driver_rows import driver_rows
from ._tokens import bytes_to_ids, unpack_ids_raw, unpack_logprobs

_messages = schema.Message.__table__
_tools = schema.ToolSchema.__table__
_COLUMNS = ("id", "rollout_id", "seq", "tool_schema_hash", "finish_reason", "token_exact", "error_class",
            "upstream_status", "policy_version_id", "image_hashes", "metadata", "prompt_base_call_id",
            "prompt_base_len", "prompt_tail", "prompt_ids_base_call_id", "prompt_ids_prefix_len", "prompt_ids_tail",
            "n_prompt_tokens", "completion_ids", "completion_logprobs", "ingest_seq")
_Record = namedtuple("_Record", _COLUMNS)


@dataclass(slots=True)
class TokenCall:
    """A call as a token-level export reads it. Token arrays are raw bytes: ``full`` is prompt + completion ids
    (uint32 little-endian; None when the engine gave no prompt ids), of which the first ``n_prompt`` are the
    prompt; ``completion`` the completion ids (None when none were recorded); ``logprobs`` float32
    little-endian, one per completion token (None when none were recorded). ``messages`` and ``tools`` are filled
    on each rollout's first readable call only (None on the others)."""

    id: str
    rollout_id: str
    seq: int
    tool_schema_hash: str | None
    finish_reason: str | None
    token_exact: bool
    error_class: str | None
    upstream_status: int | None
    policy_version_id: str | None
    image_hashes: list[str] | None
    metadata: dict | None
    full: bytes | None
    n_prompt: int
    completion: bytes | None
    logprobs: bytes | None
    ingest_seq: int
    messages: list[dict] | None = None
    tools: list | None = None

    @property
    def prompt_raw(self) -> bytes | None:
        return None if self.full is None else self.full[: self.n_prompt * 4]

    @property
    def prompt_token_ids(self) -> list[int] | None:
        raw = self.prompt_raw
        return None if raw is None else bytes_to_ids(raw)

    @property
    def completion_token_ids(self) -> list[int] | None:
        return None if self.completion is None else bytes_to_ids(self.completion)

    @property
    def completion_logprobs(self) -> list[float] | None:
        if self.logprobs is None:
            return None
        arr = array("f")
        arr.frombytes(self.logprobs)
        if array("I", [1]).tobytes()[0] != 1:  # big-endian host
            arr.byteswap()
        return arr.tolist()


def _logprobs_raw(blob: bytes | None) -> bytes | None:
    if blob is None:
        return None
    if blob[:1] != b"f":
        unpack_logprobs(blob)  # raises the store's error for an unknown tag
    return bytes(blob[1:])


def _completion_raw(blob: bytes | None) -> bytes | None:
    if blob is None:
        return None
    return unpack_ids_raw(blob) if blob else b""  # an empty column value is an empty completion, as calls() reads it


def token_calls(conn: sa.Connection, rollout_ids: Sequence[str], as_of: int | None = None, chunk: int = 500,
                damage: reads.Damage | None = None) -> dict[str, list[TokenCall]]:
    """Rollout id -> its calls in order (seq, then id) as :class:`TokenCall`; a rollout without calls maps to [].
    ``damage`` as for ``calls_by_rollout`` (the same calls with the same reasons); without it damage is logged."""
    ids = list(dict.fromkeys(rollout_ids))
    out: dict[str, list[TokenCall]] = {rid: [] for rid in ids}
    found: reads.Damage = defaultdict(list)
    pg = conn.dialect.name == "postgresql"
    for i in range(0, len(ids), chunk):
        part = ids[i:i + chunk]
        params = {"ids": part if pg else json.dumps(part), "wm": as_of}
        found_rows = driver_rows(conn, _query(pg, as_of, _CALLS_SQL), params)  # tuples: see _COLUMNS
        rows = {r[0]: r for r in (found_rows if pg else _by_id(found_rows))}
        bad: dict[str, str] = {}
        ids_of = _forward(rows, bad)  # call id -> (full ids, completion ids)
        missing = _missing_bodies(conn, rows, pg)
        prompts: dict[str, list[str]] = {}
        if ids_of is None or missing:  # a base after its call, or a message body gone: the general resolver
            bad = {}
            prompts, full_ids = reads.resolve_deltas({cid: _record(r, pg) for cid, r in rows.items()}, bad)
            ids_of = {cid: (full, _completion_raw(rows[cid][18])) for cid, full in full_ids.items()}
            for cid in rows:
                why = None if cid in bad else reads.missing_message(prompts[cid], _Absent(missing))
                if why:
                    bad[cid] = why
        for (cid, rid, seq, schema_hash, finish, exact, error, status, policy, images, meta, _, _, _, _, _, _,
             n_prompt, _, logprobs, ingest) in rows.values():
            if cid in bad:
                continue
            full, completion = ids_of[cid]
            out[rid].append(TokenCall(
                cid, rid, seq, schema_hash, finish, bool(exact), error, status, policy,
                None if images is None else json_value(images, pg), None if meta is None else json_value(meta, pg),
                full, n_prompt or 0, completion, _logprobs_raw(logprobs), ingest))
        firsts = [c for rid in part for c in out[rid][:1]]
        _first_prompts(conn, firsts, {c.id: prompts[c.id] if c.id in prompts else _prompt_of(c.id, rows, pg)
                                      for c in firsts})
        for cid, why in bad.items():
            found[rows[cid][1]].append({"call_id": cid, "seq": rows[cid][2], "why": why})
        if damage is not None:
            reads.refused_calls(conn, part, as_of, found)
    reads.report_damage(found, damage)
    return out


_CALLS_SQL = ("SELECT id, rollout_id, seq, tool_schema_hash, finish_reason, token_exact, error_class, upstream_status, "
              "policy_version_id, NULLIF(CAST(image_hashes AS TEXT), 'null') AS image_hashes, "
              "NULLIF(CAST(metadata AS TEXT), 'null') AS metadata, "
              "prompt_base_call_id, prompt_base_len, CAST(prompt_tail AS TEXT) AS prompt_tail, "
              "prompt_ids_base_call_id, prompt_ids_prefix_len, prompt_ids_tail, n_prompt_tokens, completion_ids, "
              "completion_logprobs, ingest_seq FROM calls WHERE {ids} {wm} ORDER BY {order}")

# Which of a chunk's message hashes have a body (one indexed probe each, however many calls name them)
_PRESENT_SQL = {False: "SELECT sha256 FROM messages WHERE sha256 IN (SELECT value FROM json_each(:h))",
                True: "SELECT sha256 FROM messages WHERE sha256 = ANY(:h)"}


def _query(pg: bool, as_of: int | None, sql: str) -> str:
    """``sql`` for this dialect, the chunk's rollout ids one parameter (an array on PostgreSQL, a JSON list on
    SQLite): JSON columns come back as text (decoded here by orjson, a third of the read's time before)."""
    return sql.format(
        ids="calls.rollout_id = ANY(:ids)" if pg else "calls.rollout_id IN (SELECT value FROM json_each(:ids))",
        # "+ 0" on PostgreSQL: the watermark must not pick the ingest_seq index (right after a bulk load, before
        # ANALYZE, the planner took it and scanned every call of the store for each run: 166 ms instead of 7)
        wm="" if as_of is None else "AND calls.ingest_seq + 0 <= :wm" if pg else "AND calls.ingest_seq <= :wm",
        # SQLite reads (rollout_id, seq) in its index's order, but "id" on top made it sort every row, token
        # arrays and all, in a temporary B-tree (half the query's time): equal seqs are put in id order by _by_id
        order="rollout_id, seq, id" if pg else "rollout_id, seq")


def _missing_bodies(conn: sa.Connection, rows: dict, pg: bool) -> set[str]:
    """The message hashes named in the rows' prompt tails whose body is not in the messages table (almost always
    none). The tails come with the rows; the database is asked once which of their distinct hashes it holds. (A
    query of its own that took every tail apart with ``json_each`` cost a fifth of the read on SQLite; on
    PostgreSQL it hash-joined the whole messages table, 90 ms a run.)"""
    named: set[str] = set()
    for r in rows.values():
        tail = r[13]
        if tail and tail != "[]":
            named.update(json_value(tail, pg))
    if not named:
        return set()
    wanted = list(named)
    present = {h for (h,) in driver_rows(conn, _PRESENT_SQL[pg], {"h": wanted if pg else _json_text(wanted)})}
    return named - present


def _json_text(values: list) -> str:
    """``values`` as JSON text for SQLite's ``json_each`` (orjson: ``json.dumps`` of a run's hashes cost as much as
    the probes; a bytes parameter would be bound as a BLOB, which SQLite reads as JSONB)."""
    try:
        return orjson.dumps(values).decode()
    except TypeError:  # a damaged tail's value orjson does not write (an integer past 64 bits): the json module does
        return json.dumps(values)


def _by_id(rows: list[tuple]) -> list[tuple]:
    """Rows in (rollout, seq) order in (rollout, seq, id) order (SQLite's: it compares text as UTF-8 bytes, which
    orders as Python compares str). Equal seqs within a rollout are rare: the rows are sorted only when there are."""
    if len({(r[1], r[2]) for r in rows}) == len(rows):
        return rows
    return sorted(rows, key=lambda r: (r[1], r[2], r[0]))


def _forward(rows: dict, bad: dict[str, str]) -> dict[str, tuple[bytes | None, bytes | None]] | None:
    """Every call's (full token ids: prompt + completion, its completion ids), raw, in one pass in row order, each
    delta on a call already resolved; the calls whose delta cannot be resolved go into ``bad`` with
    ``resolve_deltas``'s reasons. None when a delta's base comes after its call (then the general resolver takes
    the chunk)."""
    out: dict[str, tuple[bytes | None, bytes | None]] = {}
    for cid, r in rows.items():
        prompt_base, ids_base = r[11], r[14]
        if (prompt_base and prompt_base not in out) or (ids_base and ids_base not in out):
            why = _unresolved(rows, out, bad, prompt_base, ids_base)
            if why is None:
                return None
            bad[cid] = why
            continue
        blob, tail = r[18], r[16]
        completion = None if blob is None else unpack_ids_raw(blob) if blob else b""
        if tail is None:
            out[cid] = (None, completion)
            continue
        prompt = tail[1:] if tail[:1] == b"I" else unpack_ids_raw(tail)
        if ids_base:
            head = out[ids_base][0]
            prompt = b"".join((head[: r[15] * 4], prompt)) if head else prompt
        out[cid] = (b"".join((prompt, completion)) if completion else prompt, completion)
    return out


def _unresolved(rows: dict, full: dict, bad: dict[str, str], prompt_base: str | None, ids_base: str | None):
    """Why a call whose bases are ``prompt_base`` and ``ids_base`` cannot be read (one of them is not resolved), or
    None when a base is in the chunk but not yet resolved (it comes after the call)."""
    for base, what in ((prompt_base, "prompt"), (ids_base, "prompt token ids")):
        if not base:
            continue
        if base in bad:
            return f"its {what} is stored as a delta on call {base}, which cannot be read"
        if base not in full:
            if base in rows:
                return None
            return f"its {what} is stored as a delta on call {base}, which is not in the store"
    raise AssertionError("_unresolved called for a call whose bases are resolved")


class _Absent:
    """Membership in "every hash but ``missing``" (what ``missing_message`` asks of the bodies present)."""

    def __init__(self, missing: set[str]):
        self.missing = missing

    def __contains__(self, h: str) -> bool:
        return h not in self.missing


def _record(row, pg: bool):
    """A call row with its prompt tail decoded, as ``resolve_deltas`` reads it."""
    return _Record(*row[:13], json_value(row[13], pg), *row[14:])


def _prompt_of(cid: str, rows: dict, pg: bool) -> list[str]:
    """A readable call's full prompt (message hashes), through its prompt deltas."""
    r = rows[cid]
    tail = list(json_value(r[13], pg) or ())
    if not r[11]:
        return tail
    return _prompt_of(r[11], rows, pg)[: r[12]] + tail


def json_value(text: str | None, pg: bool):
    """A JSON column's value from its text, as the store's JSON type reads it (on PostgreSQL, a wrapped value
    unwrapped: ``_schema.StoredJSON``)."""
    if text is None:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:  # what orjson does not read (huge integers, NaN) the json module does
        value = json.loads(text)
    if pg and isinstance(value, dict) and len(value) == 1 and isinstance(value.get(schema.JSON_WRAP), str):
        return json.loads(value[schema.JSON_WRAP])
    return value


def _first_prompts(conn: sa.Connection, firsts: list[TokenCall], prompts: dict[str, list[str]]) -> None:
    """Fill ``messages`` and ``tools`` of each rollout's first readable call (one query for their bodies each)."""
    if not firsts:
        return
    bodies = reads.load_bodies(conn, _messages, {h for c in firsts for h in prompts[c.id]})
    tools = reads.load_bodies(conn, _tools, {c.tool_schema_hash for c in firsts if c.tool_schema_hash})
    for c in firsts:
        c.messages = [json.loads(bodies[h]) for h in prompts[c.id]]
        c.tools = json.loads(tools[c.tool_schema_hash]) if c.tool_schema_hash in tools else None
