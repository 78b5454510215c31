"""Full-text search over every call: ``call_search`` (a call's new prompt messages, answer and error as text),
indexed with trigrams: SQLite's FTS5 (``call_search_fts``, kept current by triggers on ``call_search``) and
PostgreSQL's pg_trgm (a GIN index on ``body``). Calls stored before this revision are indexed here.

Revision ID: 0006
Revises: 0004 (issue 33; issue 35's 0005 is chained in on merge)
Create Date: 2026-12-02 17:00:00
"""
import json

from alembic import op
import sqlalchemy as sa

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

_TRIGGERS = {
    "call_search_ai": "AFTER INSERT ON call_search BEGIN "
                      "INSERT INTO call_search_fts(rowid, body) VALUES (new.ingest_seq, new.body); END",
    "call_search_ad": "AFTER DELETE ON call_search BEGIN INSERT INTO call_search_fts(call_search_fts, rowid, body) "
                      "VALUES ('delete', old.ingest_seq, old.body); END",
    "call_search_au": "AFTER UPDATE ON call_search BEGIN INSERT INTO call_search_fts(call_search_fts, rowid, body) "
                      "VALUES ('delete', old.ingest_seq, old.body); "
                      "INSERT INTO call_search_fts(rowid, body) VALUES (new.ingest_seq, new.body); END",
}


def upgrade() -> None:
    bind = op.get_bind()
    op.create_table('call_search',
    sa.Column('ingest_seq', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=False, nullable=False),
    sa.Column('call_id', sa.String(length=128), nullable=False),
    sa.Column('rollout_id', sa.String(length=128), nullable=True),
    sa.Column('body', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('ingest_seq')
    )
    with op.batch_alter_table('call_search', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_call_search_call_id'), ['call_id'], unique=True)
        batch_op.create_index(batch_op.f('ix_call_search_rollout_id'), ['rollout_id'], unique=False)
    if bind.dialect.name == 'postgresql':
        # One extension per database, in ``public`` where there is one (not in a project's schema, ``?project=``,
        # whose DROP would take every other project's search index with it); the operator class is named with the
        # extension's schema, which a project's search_path does not hold.
        public = bind.execute(sa.text("SELECT 1 FROM pg_namespace WHERE nspname = 'public'")).scalar() is not None
        op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm" + (" WITH SCHEMA public" if public else ""))
        where = bind.execute(sa.text("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = "
                                     "e.extnamespace WHERE e.extname = 'pg_trgm'")).scalar_one()
        quoted = bind.dialect.identifier_preparer.quote_identifier(where)
        op.execute(f"CREATE INDEX ix_call_search_body_trgm ON call_search USING gin (body {quoted}.gin_trgm_ops)")
    else:
        try:
            op.execute("CREATE VIRTUAL TABLE call_search_fts USING fts5(body, content='call_search', "
                       "content_rowid='ingest_seq', tokenize='trigram')")
        except sa.exc.OperationalError as exc:
            raise RuntimeError(f"SQLite {bind.dialect.dbapi.sqlite_version} cannot create the search index ({exc}): "
                               "full-text search needs FTS5 with the trigram tokenizer, SQLite 3.34 or newer; run "
                               "OpenForge on a Python built with a newer SQLite") from None
        for name, body in _TRIGGERS.items():
            op.execute(f"CREATE TRIGGER {name} {body}")
    _index_existing_calls(bind)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == 'postgresql':
        op.execute("DROP INDEX IF EXISTS ix_call_search_body_trgm")
    else:
        for name in _TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
        op.execute("DROP TABLE IF EXISTS call_search_fts")
    with op.batch_alter_table('call_search', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_call_search_rollout_id'))
        batch_op.drop_index(batch_op.f('ix_call_search_call_id'))
    op.drop_table('call_search')


# ---- the calls stored before this revision: a frozen copy of forge_store/_search_text.py's rules ----------------
_MAX_CHARS = 200_000
_SKIP_KEYS = frozenset({"role", "type", "id", "tool_call_id", "call_id", "index", "media_type", "detail",
                        "mime_type", "format", "cache_control"})
_SKIP_PREFIXES = ("data:", "openforge-blob:")
_WRAP = "$openforge_json"  # PostgreSQL's wrapper of JSON values it cannot hold (README: U+0000, NaN)


def _strings(value, out):
    if isinstance(value, str):
        if value and not value.startswith(_SKIP_PREFIXES):
            out.append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k not in _SKIP_KEYS:
                _strings(v, out)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)


def _text(value) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if isinstance(value, dict) and set(value) == {_WRAP}:
        value = json.loads(value[_WRAP])
    out = []
    _strings(value, out)
    return "\n".join(out)


def _index_existing_calls(bind, batch: int = 2000) -> None:
    calls = sa.table("calls", sa.column("ingest_seq", sa.BigInteger), sa.column("id", sa.String),
                     sa.column("rollout_id", sa.String), sa.column("prompt_tail", sa.JSON),
                     sa.column("prompt_base_call_id", sa.String),
                     sa.column("response_message_hash", sa.String), sa.column("response", sa.JSON),
                     sa.column("error_detail", sa.Text))
    messages = sa.table("messages", sa.column("sha256", sa.String), sa.column("body", sa.Text))
    search = sa.table("call_search", sa.column("ingest_seq", sa.BigInteger), sa.column("call_id", sa.String),
                      sa.column("rollout_id", sa.String), sa.column("body", sa.Text))
    last = -1
    while True:
        rows = bind.execute(sa.select(calls).where(calls.c.ingest_seq > last).order_by(calls.c.ingest_seq)
                            .limit(batch)).mappings().all()
        if not rows:
            return
        last = rows[-1]["ingest_seq"]
        tails = [r["prompt_tail"] if isinstance(r["prompt_tail"], list) else json.loads(r["prompt_tail"] or "[]")
                 for r in rows]
        base_ids = sorted({r["prompt_base_call_id"] for r in rows if r["prompt_base_call_id"]})
        answers = dict(bind.execute(sa.select(calls.c.id, calls.c.response_message_hash)
                                    .where(calls.c.id.in_(base_ids))).all()) if base_ids else {}
        tails = [[h for h in t if h != answers.get(r["prompt_base_call_id"])] for r, t in zip(rows, tails)]
        wanted = {h for t in tails for h in t} | {r["response_message_hash"] for r in rows if r["response_message_hash"]}
        bodies = dict(bind.execute(sa.select(messages.c.sha256, messages.c.body)
                                   .where(messages.c.sha256.in_(sorted(wanted)))).all()) if wanted else {}
        out = []
        for r, tail in zip(rows, tails):
            parts = [_text(bodies.get(h, "")) for h in tail]
            answer = bodies.get(r["response_message_hash"]) if r["response_message_hash"] else r["response"]
            parts.append(_text(answer) if answer is not None else "")
            parts.append(r["error_detail"] or "")
            body = "\n".join(p for p in parts if p)[:_MAX_CHARS].replace("\x00", "\ufffd")
            out.append({"ingest_seq": r["ingest_seq"], "call_id": r["id"], "rollout_id": r["rollout_id"],
                        "body": body})
        bind.execute(search.insert(), out)
