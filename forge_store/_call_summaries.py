"""Light, batched reads of calls for behaviour analysis: :class:`CallSummary` for many rollouts at once.

``Store.calls`` resolves every call's full prompt, which costs O(turns^2) JSON decoding per rollout: right for one
trajectory, slow for thousands. Behaviour rubrics only need each call's answer, its declared tools and the
messages that are new in its prompt (every tool result is new in exactly one prompt; the union of the new messages
over a rollout's calls is everything its prompts showed), so this reads only those.

The messages a chunk's prompt tails name were written with its calls (the writer gives a call's new messages its
own ingest_seq): one range scan of ``messages`` by ingest_seq around the chunk's calls finds nearly all of them,
where looking each hash up by its key was a random index probe per message (two million for the 1M-call bench
store, most of the database's time, plus the hashes sent as array parameters). A hash outside the range (a system
prompt every rollout shares) is looked up by its key; the range is skipped when it is much wider than the chunk
(calls of a rollout that ran for weeks between others'), so the result never depends on where messages lie.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter

import orjson
import sqlalchemy as sa

from . import _schema as schema
from ._column_types import JSON_WRAP
from ._reads import ids_in
from ._token_calls import json_value

_calls = schema.Call.__table__
_messages = schema.Message.__table__
_tools = schema.ToolSchema.__table__
_ANSWER = ("tool", "assistant")  # the roles an answer is read with


@dataclass(frozen=True)
class CallSummary:
    """The part of a ``StoredCall`` that behaviour rubrics read. ``messages`` holds only the messages that are new
    in this call's prompt (its ``prompt_tail``), not the whole prompt; ``tools`` is the decoded tool list
    ``tool_schema_hash`` names (one object per schema within a read)."""

    id: str
    rollout_id: str
    seq: int
    messages: list
    tools: list | None
    response: dict | None
    response_message: dict | None
    tool_schema_hash: str | None = None


def call_summaries(conn: sa.Connection, rollout_ids: Sequence[str], chunk: int = 500, *, margin: int = 1000,
                   width: int = 20) -> dict[str, list[CallSummary]]:
    """Rollout id -> its calls in order (seq, id); a rollout without calls maps to an empty list. ``margin`` and
    ``width`` shape the range scan (see the module docstring); they change how fast, never what."""
    ids = list(dict.fromkeys(rollout_ids))
    out: dict[str, list[CallSummary]] = {rid: [] for rid in ids}
    pg = conn.dialect.name == "postgresql"
    # JSON columns as text, decoded here (orjson): the driver's and the JSON type's decoding was a third of a read
    q = sa.select(_calls.c.id, _calls.c.rollout_id, _calls.c.seq, sa.cast(_calls.c.prompt_tail, sa.Text),
                  sa.cast(_calls.c.response, sa.Text), _calls.c.response_message_hash, _calls.c.tool_schema_hash,
                  _calls.c.ingest_seq).order_by(_calls.c.rollout_id, _calls.c.seq, _calls.c.id)
    rows = []
    for i in range(0, len(ids), chunk):
        part = conn.execute(q.where(ids_in(_calls.c.rollout_id, ids[i:i + chunk], pg))).all()
        rows += _resolved(conn, part, pg, margin, width)
    schemas = sorted({r[6] for r in rows if r[6]})
    tools = {h: _loads(b) for h, b in conn.execute(
        sa.select(_tools.c.sha256, _tools.c.body).where(ids_in(_tools.c.sha256, schemas, pg)))} if schemas else {}
    for cid, rid, seq, msgs, response, answer, schema_hash in rows:
        out[rid].append(CallSummary(
            id=cid, rollout_id=rid, seq=seq, messages=msgs,
            tools=tools.get(schema_hash), response=response, response_message=answer, tool_schema_hash=schema_hash))
    return out


def _resolved(conn: sa.Connection, rows: list, pg: bool, margin: int, width: int) -> list[tuple]:
    """Each call row with its tail's messages and its answer decoded:
    (id, rollout_id, seq, new messages, response, answer, tool_schema_hash)."""
    if not rows:
        return []
    tails = [t or () for t in _json_values([r[3] for r in rows], pg)]
    answers = {r[5] for r in rows if r[5]}
    results: dict[str, str] = {}  # hash -> body of a message
    answer_bodies: dict[str, str] = {}  # hash -> body of a tool or assistant message (read only for answers)
    seen: set[str] = set()

    def take(found: list) -> None:
        seen.update(map(itemgetter(0), found))
        results.update((h, body) for h, role, body in found if body is not None)
        if answers:
            answer_bodies.update((h, body) for h, role, body in found
                                 if body is not None and role in _ANSWER and h in answers)

    named = set(chain.from_iterable(tails))
    seqs = list(map(itemgetter(7), rows))
    lo, hi = min(seqs) - margin, max(seqs)
    if hi - lo <= width * len(rows) + margin:
        take(conn.execute(sa.select(_messages.c.sha256, _messages.c.role, _messages.c.body).where(
            _messages.c.ingest_seq.between(lo, hi))).all())
    missing = sorted((named | answers) - seen)
    for i in range(0, len(missing), 5000):
        take(conn.execute(sa.select(_messages.c.sha256, _messages.c.role, _messages.c.body).where(
            ids_in(_messages.c.sha256, missing[i:i + 5000], pg))).all())
    used = list(named & results.keys())
    decoded = dict(zip(used, _loads_all([results[h] for h in used])))
    given = list(answers & answer_bodies.keys())
    answered = dict(zip(given, _loads_all([answer_bodies[h] for h in given])))
    return [(cid, rid, seq, [decoded[h] for h in tail if h in decoded], response,
             answered.get(answer) if answer else None, schema_hash)
            for (cid, rid, seq, _, _, answer, schema_hash, _), tail, response
            in zip(rows, tails, _json_values([r[4] for r in rows], pg))]


def _loads_all(bodies: list[str]) -> list:
    """``[_loads(b) for b in bodies]`` as one decode of them joined into an array (a call per body cost more than
    the decoding); each alone where that does not give one value per body."""
    try:
        values = orjson.loads("[" + ",".join(bodies) + "]")
    except orjson.JSONDecodeError:
        values = None
    return values if values is not None and len(values) == len(bodies) else [_loads(b) for b in bodies]


def _json_values(texts: list[str | None], pg: bool) -> list:
    """``[json_value(t, pg) for t in texts]``, decoded as one array (see :func:`_loads_all`)."""
    try:
        values = orjson.loads("[" + ",".join("null" if t is None else t for t in texts) + "]")
    except orjson.JSONDecodeError:
        values = None
    if values is None or len(values) != len(texts):
        return [json_value(t, pg) for t in texts]
    if pg:  # a wrapped value (see _schema.StoredJSON) is unwrapped as json_value does
        return [json_value(t, pg) if isinstance(v, dict) and len(v) == 1 and JSON_WRAP in v else v
                for v, t in zip(values, texts)]
    return values


def _loads(body: str):
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:  # what orjson does not read (NaN, huge integers) json does
        return json.loads(body)
