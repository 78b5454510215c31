"""``Store.timeline(rollout_id)``: one rollout's calls as a timeline page shows them, in one light read.

``Store.calls`` resolves every call's full prompt and token ids: O(turns^2) for a long rollout (a 1,000-call rollout
took over 30 s on this machine). A timeline needs only what each call adds: the messages new in its prompt (its
``prompt_tail``), its answer, its timings and error, and the lengths and delta bases that say whether it extends the
previous call (``extends_tokens`` is the learner's segment rule, read off the token delta: the prompt starts with
the previous call's prompt + completion; ``extends_messages`` the same on messages). Two queries, whatever the
rollout's length: the calls, then the message bodies they name.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from . import _schema as schema
from ._call_summaries import _json_values, _loads_all
from ._reads import ids_in

_calls = schema.Call.__table__
_messages = schema.Message.__table__


@dataclass(frozen=True)
class TimelineCall:
    """One call of a rollout's timeline. ``new_messages``: the prompt messages it adds to its delta base (all of
    them for a call that starts a new segment)."""

    id: str
    seq: int
    started_at: datetime
    ended_at: datetime | None
    ttft_ms: float | None
    latency_ms: float | None
    finish_reason: str | None
    error_class: str | None
    error_detail: str | None
    upstream_status: int | None
    policy_version_id: str | None
    token_exact: bool
    n_prompt_messages: int
    n_prompt_tokens: int | None
    n_completion_tokens: int | None
    new_messages: list[dict]
    response: dict | None
    response_message: dict | None
    image_hashes: list[str] | None
    system_prompt_hash: str | None
    retry_of: str | None
    extends_messages: bool  # its prompt is the previous call's prompt plus new messages
    extends_tokens: bool | None  # its prompt ids start with the previous call's prompt + completion (None: no ids)


_COLS = ("id", "seq", "started_at", "ended_at", "ttft_ms", "latency_ms", "finish_reason", "error_class",
         "error_detail", "upstream_status", "policy_version_id", "token_exact", "n_prompt_messages", "n_prompt_tokens",
         "n_completion_tokens", "system_prompt_hash", "retry_of", "prompt_base_call_id", "prompt_base_len",
         "prompt_ids_base_call_id", "prompt_ids_prefix_len", "response_message_hash")


def timeline(conn: sa.Connection, rollout_id: str) -> list[TimelineCall]:
    pg = conn.dialect.name == "postgresql"
    q = (sa.select(*(_calls.c[c] for c in _COLS), sa.cast(_calls.c.prompt_tail, sa.Text),
                   sa.cast(_calls.c.response, sa.Text), sa.cast(_calls.c.image_hashes, sa.Text))
         .where(_calls.c.rollout_id == rollout_id).order_by(_calls.c.seq, _calls.c.id))
    rows = conn.execute(q).all()
    n = len(_COLS)
    tails = [t or [] for t in _json_values([r[n] for r in rows], pg)]
    responses = _json_values([r[n + 1] for r in rows], pg)
    images = _json_values([r[n + 2] for r in rows], pg)
    answer_of = {r.id: r.response_message_hash for r in rows}
    wanted = sorted({h for t in tails for h in t} | {h for h in answer_of.values() if h})
    bodies: dict[str, str] = {}
    for i in range(0, len(wanted), 5000):
        bodies.update(conn.execute(sa.select(_messages.c.sha256, _messages.c.body)
                                   .where(ids_in(_messages.c.sha256, wanted[i:i + 5000], pg))).all())
    keys = list(bodies)
    decoded = dict(zip(keys, _loads_all([bodies[k] for k in keys])))
    out: list[TimelineCall] = []
    prev = None
    for r, tail, response, imgs in zip(rows, tails, responses, images):
        extends_messages = bool(prev is not None and r.prompt_base_call_id == prev.id
                                and r.prompt_base_len == prev.n_prompt_messages)
        extends_tokens = None
        if r.n_prompt_tokens is not None and prev is not None and prev.n_prompt_tokens is not None:
            extends_tokens = (r.prompt_ids_base_call_id == prev.id and r.prompt_ids_prefix_len
                              == prev.n_prompt_tokens + (prev.n_completion_tokens or 0))
        out.append(TimelineCall(
            id=r.id, seq=r.seq, started_at=r.started_at, ended_at=r.ended_at, ttft_ms=r.ttft_ms,
            latency_ms=r.latency_ms, finish_reason=r.finish_reason, error_class=r.error_class,
            error_detail=r.error_detail, upstream_status=r.upstream_status, policy_version_id=r.policy_version_id,
            token_exact=bool(r.token_exact), n_prompt_messages=r.n_prompt_messages, n_prompt_tokens=r.n_prompt_tokens,
            n_completion_tokens=r.n_completion_tokens, new_messages=[decoded[h] for h in tail if h in decoded],
            response=response, response_message=decoded.get(r.response_message_hash), image_hashes=imgs,
            system_prompt_hash=r.system_prompt_hash, retry_of=r.retry_of, extends_messages=extends_messages,
            extends_tokens=extends_tokens))
        prev = r
    return out
