"""Light, batched reads of calls for behaviour analysis: :class:`CallSummary` for many rollouts at once.

``Store.calls`` resolves every call's full prompt, which costs O(turns^2) JSON decoding per rollout: right for one
trajectory, slow for thousands. Behaviour rubrics only need each call's answer, its declared tools and the tool
messages that are new in its prompt (every tool result is new in exactly one prompt), so this reads those in three
queries per chunk of rollouts, without resolving prompt deltas or token ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from . import _schema as schema

_calls = schema.Call.__table__
_messages = schema.Message.__table__
_tools = schema.ToolSchema.__table__


@dataclass(frozen=True)
class CallSummary:
    """The part of a ``StoredCall`` that behaviour rubrics read. ``messages`` holds only the ``role: "tool"``
    messages that are new in this call's prompt (its ``prompt_tail``), not the whole prompt."""

    id: str
    rollout_id: str
    seq: int
    messages: list
    tools: list | None
    response: dict | None
    response_message: dict | None


def call_summaries(conn: sa.Connection, rollout_ids: Sequence[str], chunk: int = 500) -> dict[str, list[CallSummary]]:
    """Rollout id -> its calls in order (seq, id); a rollout without calls maps to an empty list."""
    ids = list(dict.fromkeys(rollout_ids))
    out: dict[str, list[CallSummary]] = {rid: [] for rid in ids}
    q = sa.select(_calls.c.id, _calls.c.rollout_id, _calls.c.seq, _calls.c.prompt_tail, _calls.c.response,
                  _calls.c.response_message_hash, _calls.c.tool_schema_hash)
    rows = [r for i in range(0, len(ids), chunk) for r in conn.execute(
        q.where(_calls.c.rollout_id.in_(ids[i:i + chunk])).order_by(_calls.c.rollout_id, _calls.c.seq, _calls.c.id))]
    hashes = sorted({h for r in rows for h in r.prompt_tail or ()} | {r.response_message_hash for r in rows
                                                                       if r.response_message_hash})
    bodies: dict[str, str] = {}
    for i in range(0, len(hashes), chunk):  # only tool results and answers: the rest of a prompt is not needed
        bodies.update(conn.execute(sa.select(_messages.c.sha256, _messages.c.body).where(
            _messages.c.sha256.in_(hashes[i:i + chunk]), _messages.c.role.in_(("tool", "assistant")))).all())
    schemas = sorted({r.tool_schema_hash for r in rows if r.tool_schema_hash})
    tools = {h: json.loads(b) for h, b in conn.execute(
        sa.select(_tools.c.sha256, _tools.c.body).where(_tools.c.sha256.in_(schemas)))} if schemas else {}
    for r in rows:
        msgs = [json.loads(bodies[h]) for h in r.prompt_tail or () if h in bodies]
        answer = bodies.get(r.response_message_hash)
        out[r.rollout_id].append(CallSummary(
            id=r.id, rollout_id=r.rollout_id, seq=r.seq, messages=[m for m in msgs if m.get("role") == "tool"],
            tools=tools.get(r.tool_schema_hash), response=r.response,
            response_message=json.loads(answer) if answer is not None else None))
    return out
