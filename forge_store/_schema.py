"""The lineage store's tables (SQLAlchemy 2.0), one per noun of DESIGN.md's data model.

References between rows are by id and deliberately not enforced by foreign keys: the proxy, the orchestrator and
the learner write through separate journals, so the database may receive a call before its rollout row. Readers
treat a dangling reference as data to report (the learner turns it into an exclusion), never as a crash.

Every row carries ``ingest_seq``, assigned by the writer from one counter row inside the inserting transaction;
the counter's row lock orders commits, so every row with ``ingest_seq <= watermark()`` is already visible and an
export pinned to a watermark reads the same rows forever (invariant 5). Rollouts are the one mutable row: their
finish is stamped with ``finished_seq`` so ``as_of`` reads see a rollout as unfinished until that point.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# The column types live in _column_types; these names stay importable from here (snapshots, reads and tests use them).
from ._column_types import JSON_WRAP, JsonType, StoredJSON, StoredText, UTCDateTime, utcnow  # noqa: F401
from ._errors import InvalidRecord


class Base(DeclarativeBase):
    pass


def _id() -> Mapped[str]:
    return mapped_column(sa.String(128), primary_key=True)


def _seq() -> Mapped[int]:
    return mapped_column(sa.BigInteger, nullable=False, index=True)


class StoreMeta(Base):
    __tablename__ = "store_meta"
    key: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    value: Mapped[str] = mapped_column(sa.Text, nullable=False)


class IngestCounter(Base):
    """One row (id = 1): the last ingest sequence number handed out. Its row lock serialises writers."""

    __tablename__ = "ingest_counter"
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    value: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)


class Task(Base):
    __tablename__ = "tasks"
    id: Mapped[str] = _id()
    source: Mapped[str | None] = mapped_column(StoredText)
    domain: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    instruction_hash: Mapped[str | None] = mapped_column(sa.String(64))
    verifier_hash: Mapped[str | None] = mapped_column(sa.String(64))
    environment_ref: Mapped[str | None] = mapped_column(StoredText)
    meta: Mapped[dict | None] = mapped_column("metadata", JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ingest_seq: Mapped[int] = _seq()


class TaskVersion(Base):
    """One version of a task: the sha256 of its content manifest (instruction, task.toml, environment, tests,
    solution), so the same content is the same row wherever it comes from. A rollout names the version it ran in
    its metadata (``task_version``). ``lineage`` is how the version came to be (a synthesis run's teacher rollouts,
    calls and validation rollouts), written with the version's first registration."""

    __tablename__ = "task_versions"
    id: Mapped[str] = _id()
    task_id: Mapped[str] = mapped_column(sa.String(128), nullable=False, index=True)
    instruction_hash: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    config_hash: Mapped[str | None] = mapped_column(sa.String(64))
    environment_hash: Mapped[str | None] = mapped_column(sa.String(64))
    verifier_hash: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    solution_hash: Mapped[str | None] = mapped_column(sa.String(64))
    files: Mapped[dict] = mapped_column(JsonType, nullable=False)
    source: Mapped[str | None] = mapped_column(StoredText)
    lineage: Mapped[dict | None] = mapped_column(JsonType)
    meta: Mapped[dict | None] = mapped_column("metadata", JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ingest_seq: Mapped[int] = _seq()


class Harness(Base):
    __tablename__ = "harnesses"
    id: Mapped[str] = _id()
    name: Mapped[str] = mapped_column(sa.String(128), nullable=False)
    version: Mapped[str | None] = mapped_column(sa.String(128))
    config_hash: Mapped[str | None] = mapped_column(sa.String(64))
    config: Mapped[dict | None] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ingest_seq: Mapped[int] = _seq()


class PolicyVersion(Base):
    __tablename__ = "policy_versions"
    id: Mapped[str] = _id()
    model_name: Mapped[str] = mapped_column(StoredText, nullable=False)
    checkpoint_id: Mapped[str | None] = mapped_column(StoredText)
    checkpoint_hash: Mapped[str | None] = mapped_column(sa.String(64))
    global_step: Mapped[int | None] = mapped_column(sa.BigInteger)
    tokenizer_hash: Mapped[str | None] = mapped_column(sa.String(64))
    chat_template_hash: Mapped[str | None] = mapped_column(sa.String(64))
    engine: Mapped[str | None] = mapped_column(sa.String(64))
    engine_version: Mapped[str | None] = mapped_column(sa.String(64))
    sampling_defaults: Mapped[dict | None] = mapped_column(JsonType)
    meta: Mapped[dict | None] = mapped_column("metadata", JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ingest_seq: Mapped[int] = _seq()


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[str] = _id()
    name: Mapped[str | None] = mapped_column(StoredText)
    config: Mapped[dict | None] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ingest_seq: Mapped[int] = _seq()


class RolloutGroup(Base):
    """A GRPO group: n rollouts of one task under one policy version within one run."""

    __tablename__ = "rollout_groups"
    id: Mapped[str] = _id()
    run_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    task_id: Mapped[str] = mapped_column(sa.String(128), nullable=False, index=True)
    policy_version_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    target_size: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ingest_seq: Mapped[int] = _seq()


class Rollout(Base):
    __tablename__ = "rollouts"
    id: Mapped[str] = _id()
    group_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    run_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    task_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    harness_id: Mapped[str | None] = mapped_column(sa.String(128))
    policy_version_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    backend: Mapped[str | None] = mapped_column(sa.String(64))
    image_ref: Mapped[str | None] = mapped_column(StoredText)
    image_digest: Mapped[str | None] = mapped_column(sa.String(128))
    pod_name: Mapped[str | None] = mapped_column(StoredText)
    node_name: Mapped[str | None] = mapped_column(StoredText)
    attempt: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=1)
    retry_of: Mapped[str | None] = mapped_column(sa.String(128))
    status: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    outcome: Mapped[str | None] = mapped_column(sa.String(32), index=True)
    outcome_detail: Mapped[str | None] = mapped_column(StoredText)
    meta: Mapped[dict | None] = mapped_column("metadata", JsonType)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ingest_seq: Mapped[int] = _seq()
    finished_seq: Mapped[int | None] = mapped_column(sa.BigInteger, index=True)
    task_version_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)  # task_versions.id it ran


class Message(Base):
    """A chat message, content-addressed: sha256 of its canonical JSON, which ``body`` holds verbatim."""

    __tablename__ = "messages"
    sha256: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    role: Mapped[str | None] = mapped_column(sa.String(32))
    body: Mapped[str] = mapped_column(sa.Text, nullable=False)  # canonical JSON: U+0000 is escaped there
    size: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    ingest_seq: Mapped[int] = _seq()


class ToolSchema(Base):
    """A request's tool declarations (canonical JSON of the whole list), stored once per distinct list."""

    __tablename__ = "tool_schemas"
    sha256: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    body: Mapped[str] = mapped_column(sa.Text, nullable=False)  # canonical JSON: U+0000 is escaped there
    ingest_seq: Mapped[int] = _seq()


class Blob(Base):
    """Index of the blob store: the bytes live in the blob store under their sha256."""

    __tablename__ = "blobs"
    sha256: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    size: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)
    media_type: Mapped[str | None] = mapped_column(sa.String(128))
    ingest_seq: Mapped[int] = _seq()


class Call(Base):
    """One model call. Prompt messages and prompt token ids are stored as deltas (invariant 3).

    Prompt messages = (prompt of ``prompt_base_call_id``)[:prompt_base_len] + ``prompt_tail`` (message hashes).
    Prompt token ids = (prompt ids + completion ids of ``prompt_ids_base_call_id``)[:prompt_ids_prefix_len]
    + decode(``prompt_ids_tail``). Token arrays are packed by :mod:`forge_store._tokens`.
    """

    __tablename__ = "calls"
    __table_args__ = (sa.Index("ix_calls_rollout_seq", "rollout_id", "seq"),)
    id: Mapped[str] = _id()
    rollout_id: Mapped[str | None] = mapped_column(sa.String(128))
    seq: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)
    api_surface: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    model: Mapped[str | None] = mapped_column(StoredText)
    streamed: Mapped[bool] = mapped_column(sa.Boolean, nullable=False)
    request_hash: Mapped[str] = mapped_column(sa.String(64), nullable=False, index=True)
    system_prompt_hash: Mapped[str | None] = mapped_column(sa.String(64))
    tool_schema_hash: Mapped[str | None] = mapped_column(sa.String(64))
    request_params: Mapped[dict | None] = mapped_column(JsonType)
    prompt_base_call_id: Mapped[str | None] = mapped_column(sa.String(128))
    prompt_base_len: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=0)
    prompt_tail: Mapped[list] = mapped_column(JsonType, nullable=False)
    n_prompt_messages: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    response: Mapped[dict | None] = mapped_column(JsonType)
    response_message_hash: Mapped[str | None] = mapped_column(sa.String(64))
    finish_reason: Mapped[str | None] = mapped_column(sa.String(32))
    prompt_ids_base_call_id: Mapped[str | None] = mapped_column(sa.String(128))
    prompt_ids_prefix_len: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=0)
    prompt_ids_tail: Mapped[bytes | None] = mapped_column(sa.LargeBinary)
    n_prompt_tokens: Mapped[int | None] = mapped_column(sa.Integer)
    completion_ids: Mapped[bytes | None] = mapped_column(sa.LargeBinary)
    completion_logprobs: Mapped[bytes | None] = mapped_column(sa.LargeBinary)
    n_completion_tokens: Mapped[int | None] = mapped_column(sa.Integer)
    usage: Mapped[dict | None] = mapped_column(JsonType)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ttft_ms: Mapped[float | None] = mapped_column(sa.Float)
    latency_ms: Mapped[float | None] = mapped_column(sa.Float)
    upstream_status: Mapped[int | None] = mapped_column(sa.Integer)
    error_class: Mapped[str | None] = mapped_column(sa.String(64))
    error_detail: Mapped[str | None] = mapped_column(StoredText)
    retry_of: Mapped[str | None] = mapped_column(sa.String(128))
    policy_version_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    token_exact: Mapped[bool] = mapped_column(sa.Boolean, nullable=False)
    image_hashes: Mapped[list | None] = mapped_column(JsonType)
    meta: Mapped[dict | None] = mapped_column("metadata", JsonType)
    ingest_seq: Mapped[int] = _seq()


class CallSearch(Base):
    """The searchable text of one call (``forge_store._search``): the text of the prompt messages it adds to its
    base (new user messages, tool results, a compacted history) and of its answer (text, reasoning, tool calls), and
    its error. Written by the store's writer with the call, in its transaction. Keyed by the call's ingest_seq, an
    integer key that SQLite's FTS5 index (``call_search_fts``, trigram) addresses as its rowid; PostgreSQL indexes
    ``body`` with a pg_trgm GIN index (``ix_call_search_body_trgm``). Both live in migration 0006, not here:
    :data:`UNMODELLED` names them for the models-against-migrations check."""

    __tablename__ = "call_search"
    ingest_seq: Mapped[int] = mapped_column(sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                                            autoincrement=False)
    call_id: Mapped[str] = mapped_column(sa.String(128), nullable=False, unique=True, index=True)
    rollout_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    body: Mapped[str] = mapped_column(sa.Text, nullable=False)


# Database objects of the search index that only one backend has, made by migration 0006 and left out of the models:
# SQLite's FTS5 table with its shadow tables, PostgreSQL's trigram index.
UNMODELLED = frozenset({"call_search_fts", "call_search_fts_data", "call_search_fts_idx", "call_search_fts_docsize",
                        "call_search_fts_config", "ix_call_search_body_trgm"})


def modelled(name: str | None, type_: str, parent_names: dict) -> bool:
    """Alembic's ``include_name``: whether the models describe this object (everything but :data:`UNMODELLED`)."""
    return name not in UNMODELLED


class Reward(Base):
    """Append-only: a later reward is a new row, never an overwrite."""

    __tablename__ = "rewards"
    id: Mapped[str] = _id()
    rollout_id: Mapped[str] = mapped_column(sa.String(128), nullable=False, index=True)
    value: Mapped[float] = mapped_column(sa.Float, nullable=False)
    source: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    verifier_version: Mapped[str | None] = mapped_column(sa.String(128))
    evidence_blob: Mapped[str | None] = mapped_column(sa.String(64))
    detail: Mapped[dict | None] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ingest_seq: Mapped[int] = _seq()


class Event(Base):
    __tablename__ = "events"
    id: Mapped[str] = _id()
    rollout_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    kind: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    source: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    time: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    detail: Mapped[dict | None] = mapped_column(JsonType)
    ingest_seq: Mapped[int] = _seq()


class Exclusion(Base):
    __tablename__ = "exclusions"
    id: Mapped[str] = _id()
    rollout_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    call_id: Mapped[str | None] = mapped_column(sa.String(128))
    reason: Mapped[str] = mapped_column(sa.String(32), nullable=False, index=True)
    detail: Mapped[dict | None] = mapped_column(JsonType)
    export_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ingest_seq: Mapped[int] = _seq()


class Export(Base):
    __tablename__ = "exports"
    id: Mapped[str] = _id()
    format: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    query: Mapped[str | None] = mapped_column(StoredText)
    watermark: Mapped[int] = mapped_column(sa.BigInteger, nullable=False)
    out_dir: Mapped[str | None] = mapped_column(StoredText)
    manifest: Mapped[dict | None] = mapped_column(JsonType)
    counts: Mapped[dict | None] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    ingest_seq: Mapped[int] = _seq()


def string_limits(table: sa.Table) -> dict[str, int]:
    """Column name -> the most characters its ``String(n)`` holds (PostgreSQL refuses more, SQLite does not)."""
    return {c.name: c.type.length for c in table.columns if isinstance(c.type, sa.String) and c.type.length}


def int_limits(table: sa.Table) -> dict[str, int]:
    """Column name -> ``b`` such that PostgreSQL's type holds ``-b <= value < b`` (SQLite holds any 64-bit value)."""
    return {c.name: 2**63 if isinstance(c.type, sa.BigInteger) else 2**31
            for c in table.columns if isinstance(c.type, sa.Integer)}


class Limits:
    """What ``table``'s columns (``names`` of them, or all) hold on PostgreSQL, checked before a row is journaled:
    past them PostgreSQL would refuse the row later, in the writer, where it could only be dead-lettered."""

    def __init__(self, table: sa.Table, names: tuple[str, ...] | None = None):
        self.strings = tuple((n, most) for n, most in string_limits(table).items() if names is None or n in names)
        self.ints = tuple((n, bound) for n, bound in int_limits(table).items() if names is None or n in names)

    def check(self, what: str, get) -> None:
        """InvalidRecord naming the value, the limit and the fix; ``get(name)``: the row's value (None: unset)."""
        for name, most in self.strings:
            value = get(name)
            if value is not None and (not isinstance(value, str) or len(value) > most):
                shown = str(value)[:48] + ("..." if len(str(value)) > 48 else "")
                rule = (f"is {len(value)} characters; the store holds at most {most} there: use a shorter {name}"
                        if isinstance(value, str) else "is not a string")
                raise InvalidRecord(f"{what} {name} {shown!r} {rule}")
        for name, bound in self.ints:
            value = get(name)
            if isinstance(value, int) and not -bound <= value < bound:
                raise InvalidRecord(f"{what} {name} {value} is outside the store's range for it ({-bound} to {bound - 1})")
