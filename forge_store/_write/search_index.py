"""The writer's last step for calls: each newly stored call's searchable text into ``call_search``, in the batch's
transaction (see ``forge_store._search_text`` for what the text is). On SQLite a trigger of migration 0006 copies
each new row into the FTS5 index; on PostgreSQL the trigram index follows the table.

Idempotent like the rest of ``db_apply``: a call replayed from the journal conflicts on its ``call_id`` and is
skipped. The bodies of a call's new prompt messages come from the batch (journaled with the call, or ahead of it);
the few that an earlier batch stored are read back in one query. A prompt's copy of the previous answer (the base
call's answer message, by hash) is left out: that call's text holds it already.
"""

from __future__ import annotations

import sqlalchemy as sa

from .. import _schema as schema
from .._search_text import call_text

_messages = schema.Message.__table__
_calls = schema.Call.__table__
_search = schema.CallSearch.__table__


def index_calls(conn: sa.Connection, calls: list[tuple[dict, dict]], bodies: dict[str, dict], insert_ignore) -> None:
    """``calls``: (operation, call row) of each call op in the batch; ``bodies``: hash -> message row of the batch."""
    if not calls:
        return
    answers = {row["id"]: row.get("response_message_hash") for _, row in calls}
    bases = {row["prompt_base_call_id"] for _, row in calls if row.get("prompt_base_call_id")} - set(answers)
    if bases:
        answers.update(conn.execute(sa.select(_calls.c.id, _calls.c.response_message_hash)
                                    .where(_calls.c.id.in_(sorted(bases)))).all())
    tails = [[h for h in row.get("prompt_tail") or () if h != answers.get(row.get("prompt_base_call_id"))]
             for _, row in calls]
    missing = {h for tail in tails for h in tail if h not in bodies}
    stored: dict[str, str] = {}
    if missing:
        stored = dict(conn.execute(sa.select(_messages.c.sha256, _messages.c.body)
                                   .where(_messages.c.sha256.in_(sorted(missing)))).all())
    rows = []
    for (op, row), tail in zip(calls, tails):
        prompt = [bodies[h]["body"] if h in bodies else stored.get(h, "") for h in tail]
        answer = op.get("resp") if op.get("resp") is not None else row.get("response")
        text = call_text(prompt, answer, row.get("error_detail"))
        rows.append({"ingest_seq": row["ingest_seq"], "call_id": row["id"], "rollout_id": row.get("rollout_id"),
                     "body": text.replace("\x00", "\ufffd")})  # PostgreSQL's text holds no U+0000
    insert_ignore(conn, _search, rows)
