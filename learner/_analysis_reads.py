"""Batched, light reads of what the rubrics need, for many rollouts at once.

``Store.calls`` resolves every call's full prompt, which costs O(turns^2) JSON decoding per rollout: right for one
trajectory, slow for thousands. The rubrics only need each call's answer, its declared tools and the tool messages
that are new in its prompt (every tool result is new in exactly one prompt), so this reads those in three queries
per batch of rollouts. Plain SQL over the store's tables (SQLite and PostgreSQL); read-only.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from forge_store._schema import JsonType

_CALLS = sa.text("SELECT id, rollout_id, seq, prompt_tail, response, response_message_hash, tool_schema_hash "
                 "FROM calls WHERE rollout_id IN :ids ORDER BY rollout_id, seq, id"
                 ).bindparams(sa.bindparam("ids", expanding=True)).columns(prompt_tail=JsonType, response=JsonType)
_MESSAGES = sa.text("SELECT sha256, body FROM messages WHERE sha256 IN :h AND role IN ('tool', 'assistant')"
                    ).bindparams(sa.bindparam("h", expanding=True))
_TOOLS = sa.text("SELECT sha256, body FROM tool_schemas WHERE sha256 IN :h").bindparams(sa.bindparam("h", expanding=True))


@dataclass(frozen=True)
class LightCall:
    """The part of a ``StoredCall`` the rubrics read; ``messages`` holds only the tool messages new in its prompt."""

    id: str
    rollout_id: str
    seq: int
    messages: list
    tools: list | None
    response: dict | None
    response_message: dict | None


def _json(value):
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def light_calls(engine: sa.Engine, rollout_ids: Sequence[str], *, chunk: int = 1000) -> dict[str, list[LightCall]]:
    """Rollout id -> its calls in order (seq, id), as :class:`LightCall`."""
    out: dict[str, list[LightCall]] = defaultdict(list)
    ids = list(rollout_ids)
    if not ids:
        return out
    with engine.connect() as conn:
        rows = [r for i in range(0, len(ids), chunk) for r in conn.execute(_CALLS, {"ids": ids[i:i + chunk]})]
        tails = {r.id: _json(r.prompt_tail) or [] for r in rows}
        hashes = sorted({h for t in tails.values() for h in t} | {r.response_message_hash for r in rows
                                                                  if r.response_message_hash})
        bodies: dict[str, str] = {}
        for i in range(0, len(hashes), chunk):
            bodies.update(conn.execute(_MESSAGES, {"h": hashes[i:i + chunk]}).all())
        schemas = sorted({r.tool_schema_hash for r in rows if r.tool_schema_hash})
        tools = dict(conn.execute(_TOOLS, {"h": schemas}).all()) if schemas else {}
    parsed_tools = {h: json.loads(b) for h, b in tools.items()}
    for r in rows:
        msgs = [json.loads(bodies[h]) for h in tails[r.id] if h in bodies]
        out[r.rollout_id].append(LightCall(
            id=r.id, rollout_id=r.rollout_id, seq=r.seq, messages=[m for m in msgs if m.get("role") == "tool"],
            tools=parsed_tools.get(r.tool_schema_hash), response=_json(r.response),
            response_message=json.loads(bodies[r.response_message_hash]) if r.response_message_hash in bodies else None))
    return out


_REWARDS = sa.text("SELECT rollout_id, value, ingest_seq FROM rewards WHERE rollout_id IN :ids"
                   ).bindparams(sa.bindparam("ids", expanding=True))


def latest_rewards(engine: sa.Engine, rollout_ids: Sequence[str], *, chunk: int = 1000) -> dict[str, float]:
    """Rollout id -> the value of its latest reward (rewards are append-only; the highest ingest_seq wins)."""
    best: dict[str, tuple[int, float]] = {}
    ids = list(rollout_ids)
    with engine.connect() as conn:
        for i in range(0, len(ids), chunk):
            for rid, value, seq in conn.execute(_REWARDS, {"ids": ids[i:i + chunk]}):
                if rid not in best or seq > best[rid][0]:
                    best[rid] = (seq, value)
    return {rid: v for rid, (_, v) in best.items()}
