"""What an erasure removes: a ``Selection`` (rollouts by id, task, harness, policy version, time range, text pattern)
turned into the rollouts and calls it names, and the content-addressed rows (messages, tool schemas, blobs) that
nothing kept still references once they are gone.

Criteria combine with AND (``--task t --until 2026-01-01``: that task's rollouts started before then). A pattern
selects every rollout any of whose calls contains it, and every rollout whose own text (outcome detail, metadata,
events, rewards, exclusions) does, matched against the stored text as stored: the pattern itself and its JSON-escaped
forms (message bodies are canonical JSON). Calls recorded without a rollout are selected by the pattern or by their
own policy version and start time.

Reference counting reads every kept call's message, tool-schema and image references once (one pass over the calls
table): O(calls), no index on the hashes inside ``prompt_tail`` exists to do better.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime

import sqlalchemy as sa

from . import _schema as schema
from ._errors import InvalidRecord
from ._images import REF_PREFIX
from ._rescores import Rescore

_CHUNK = 500
R, C, M, TS, B = (schema.Rollout.__table__, schema.Call.__table__, schema.Message.__table__,
                  schema.ToolSchema.__table__, schema.Blob.__table__)
RW, EV, EX, RS = (schema.Reward.__table__, schema.Event.__table__, schema.Exclusion.__table__, Rescore.__table__)
TASKS, TV = schema.Task.__table__, schema.TaskVersion.__table__


@dataclass(frozen=True)
class Selection:
    """What to erase. Empty criteria select nothing (an erasure names what it removes)."""

    rollouts: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    harnesses: tuple[str, ...] = ()   # harness ids or names
    policy_versions: tuple[str, ...] = ()
    since: datetime | None = None     # rollouts (and loose calls) started at or after
    until: datetime | None = None     # ... and before
    pattern: str | None = None
    keep: tuple[str, ...] = ()        # retention's exceptions: exported, evaluation, teacher

    def __post_init__(self):
        if not (self.rollouts or self.tasks or self.harnesses or self.policy_versions or self.since or self.until
                or self.pattern):
            raise InvalidRecord("an erasure selects nothing: pass --rollout, --task, --harness, --policy-version, "
                                "--since/--until or --pattern")
        if self.pattern is not None and len(self.pattern) < 4:
            raise InvalidRecord(f"--pattern of {len(self.pattern)} characters: a pattern needs at least 4, or it "
                                "matches far more than the secret; pass the whole secret")
        unknown = set(self.keep) - set(KEEPS)
        if unknown:
            raise InvalidRecord(f"--keep {', '.join(sorted(unknown))}: known are {', '.join(KEEPS)}")

    def describe(self) -> dict:
        """The selection as the tombstone keeps it: a pattern only as its sha256 and length (it is the secret)."""
        out = {k: (v.isoformat() if isinstance(v, datetime) else list(v) if isinstance(v, tuple) else v)
               for k, v in asdict(self).items() if v not in ((), None)}
        if self.pattern is not None:
            out["pattern"] = {"sha256": hashlib.sha256(self.pattern.encode()).hexdigest(), "chars": len(self.pattern)}
        return out


KEEPS = ("exported", "evaluation", "teacher")


@dataclass
class Chosen:
    """The rows an erasure removes, by key."""

    rollouts: dict[str, tuple[str | None, int]] = field(default_factory=dict)  # id -> (group, ingest_seq)
    calls: set[str] = field(default_factory=set)
    messages: set[str] = field(default_factory=set)
    tool_schemas: set[str] = field(default_factory=set)
    blobs: set[str] = field(default_factory=set)
    tasks: set[str] = field(default_factory=set)
    running: set[str] = field(default_factory=set)   # not finished: a live harness may still record calls

    def items(self) -> dict[str, set[str]]:
        return {"rollout": set(self.rollouts), "call": self.calls, "message": self.messages,
                "tool_schema": self.tool_schemas, "blob": self.blobs, "task": self.tasks}


def pattern_forms(pattern: str) -> list[str]:
    """The pattern as text and as it sits inside JSON strings (escaped, with and without \\u escapes)."""
    return list(dict.fromkeys([pattern, json.dumps(pattern, ensure_ascii=False)[1:-1],
                               json.dumps(pattern)[1:-1]]))


def _contains(col, forms: list[str]):
    text = col if isinstance(col.type, (sa.String, sa.Text)) and not isinstance(col.type, sa.JSON) else \
        sa.cast(col, sa.Text)
    return sa.or_(*(text.contains(f, autoescape=True) for f in forms))


def chunked(ids) -> list[list[str]]:
    ids = sorted(ids)
    return [ids[i:i + _CHUNK] for i in range(0, len(ids), _CHUNK)]


def _pattern_rollouts(conn: sa.Connection, pattern: str) -> tuple[set[str], set[str]]:
    """(rollouts, calls without a rollout) whose stored text contains ``pattern``."""
    forms = pattern_forms(pattern)
    msgs = set(conn.execute(sa.select(M.c.sha256).where(_contains(M.c.body, forms))).scalars())
    tools = set(conn.execute(sa.select(TS.c.sha256).where(_contains(TS.c.body, forms))).scalars())
    direct = sa.or_(*(_contains(C.c[c], forms) for c in ("response", "error_detail", "request_params", "metadata",
                                                          "model")))
    hits = {(r.id, r.rollout_id) for r in conn.execute(sa.select(C.c.id, C.c.rollout_id).where(direct))}
    if msgs or tools:
        q = sa.select(C.c.id, C.c.rollout_id, C.c.prompt_tail, C.c.response_message_hash, C.c.tool_schema_hash)
        for r in conn.execute(q.execution_options(yield_per=2000)):
            if (r.response_message_hash in msgs or r.tool_schema_hash in tools
                    or any(h in msgs for h in r.prompt_tail or ())):
                hits.add((r.id, r.rollout_id))
    rollouts = {rid for _, rid in hits if rid is not None}
    loose = {cid for cid, rid in hits if rid is None}
    for table, cols in ((R, ("outcome_detail", "metadata", "pod_name", "image_ref")), (EV, ("detail",)),
                        (RW, ("detail",)), (EX, ("detail",))):
        key = table.c.id if table is R else table.c.rollout_id
        cond = sa.or_(*(_contains(table.c[c], forms) for c in cols))
        rollouts |= {x for x in conn.execute(sa.select(key).where(cond)).scalars() if x is not None}
    return rollouts, loose


def select(conn: sa.Connection, sel: Selection) -> Chosen:
    """The rollouts and calls ``sel`` names, with what they alone reference."""
    where = []
    if sel.rollouts:
        where.append(R.c.id.in_(sel.rollouts))
    if sel.tasks:
        where.append(R.c.task_id.in_(sel.tasks))
    if sel.harnesses:
        hids = set(sel.harnesses) | set(conn.execute(sa.select(schema.Harness.__table__.c.id).where(
            schema.Harness.__table__.c.name.in_(sel.harnesses))).scalars())
        where.append(R.c.harness_id.in_(hids))
    if sel.policy_versions:
        where.append(R.c.policy_version_id.in_(sel.policy_versions))
    if sel.since:
        where.append(R.c.started_at >= sel.since)
    if sel.until:
        where.append(R.c.started_at < sel.until)
    loose: set[str] = set()
    matched: set[str] = set()
    if sel.pattern is not None:
        matched, loose = _pattern_rollouts(conn, sel.pattern)
        where.append(R.c.id.in_(sorted(matched) or [""]))
    chosen = Chosen()
    q = sa.select(R.c.id, R.c.group_id, R.c.ingest_seq, R.c.metadata, R.c.status).where(*where)
    for r in conn.execute(q):
        purpose = (r.metadata or {}).get("purpose") if isinstance(r.metadata, dict) else None
        if ("evaluation" in sel.keep and purpose == "eval") or ("teacher" in sel.keep and purpose == "teacher"):
            continue
        chosen.rollouts[r.id] = (r.group_id, r.ingest_seq)
        if r.status == "running":
            chosen.running.add(r.id)
    if not (sel.tasks or sel.harnesses or sel.policy_versions or sel.since or sel.until):
        # calls recorded for a named rollout whose row is gone (a harness that went on after an erasure)
        for rid in sorted((set(sel.rollouts) | matched) - chosen.rollouts.keys()):
            seq = conn.execute(sa.select(sa.func.min(C.c.ingest_seq)).where(C.c.rollout_id == rid)).scalar()
            if seq is not None:
                chosen.rollouts[rid] = (None, seq)
    if "exported" in sel.keep:
        for rid in _exported(conn, chosen.rollouts):
            chosen.rollouts.pop(rid)
    if not sel.pattern and not sel.rollouts and not sel.tasks and not sel.harnesses:
        loose_where = [C.c.rollout_id.is_(None)]   # calls without a rollout, by version and time
        if sel.policy_versions:
            loose_where.append(C.c.policy_version_id.in_(sel.policy_versions))
        if sel.since:
            loose_where.append(C.c.started_at >= sel.since)
        if sel.until:
            loose_where.append(C.c.started_at < sel.until)
        loose |= set(conn.execute(sa.select(C.c.id).where(*loose_where)).scalars())
    chosen.calls = set(loose)
    for chunk in chunked(chosen.rollouts):
        chosen.calls |= set(conn.execute(sa.select(C.c.id).where(C.c.rollout_id.in_(chunk))).scalars())
    if sel.tasks and not (sel.rollouts or sel.harnesses or sel.policy_versions or sel.since or sel.until
                          or sel.pattern):
        chosen.tasks = set(sel.tasks)   # a task erased whole (a withdrawn licence): its rows go too
    candidates(conn, chosen)
    return chosen


def _exported(conn: sa.Connection, rollouts: dict[str, tuple]) -> set[str]:
    """Of ``rollouts``, those some recorded export took as data: seen at its watermark, with no rollout-level
    exclusion row of that export."""
    ex = schema.Export.__table__
    marks = sorted(conn.execute(sa.select(ex.c.id, ex.c.watermark)).all(), key=lambda r: r.watermark)
    out = set()
    for chunk in chunked(rollouts):
        excluded: dict[str, set[str]] = {}
        for r in conn.execute(sa.select(EX.c.rollout_id, EX.c.export_id).where(
                EX.c.rollout_id.in_(chunk), EX.c.export_id.is_not(None), EX.c.call_id.is_(None))):
            excluded.setdefault(r.rollout_id, set()).add(r.export_id)
        for rid in chunk:
            if any(rollouts[rid][1] <= m.watermark and m.id not in excluded.get(rid, ()) for m in marks):
                out.add(rid)
    return out


def candidates(conn: sa.Connection, chosen: Chosen) -> None:
    """Fill ``chosen``'s messages, tool schemas and blobs: those its calls and rewards reference and no kept call,
    kept reward or kept message does."""
    msgs, tools, blobs = set(), set(), set()
    for chunk in chunked(chosen.calls):
        q = sa.select(C.c.prompt_tail, C.c.response_message_hash, C.c.tool_schema_hash, C.c.image_hashes)
        for r in conn.execute(q.where(C.c.id.in_(chunk))):
            msgs.update(r.prompt_tail or ())
            msgs.add(r.response_message_hash)
            tools.add(r.tool_schema_hash)
            blobs.update(r.image_hashes or ())
    for chunk in chunked(chosen.rollouts):
        blobs.update(conn.execute(sa.select(RW.c.evidence_blob).where(RW.c.rollout_id.in_(chunk))).scalars())
    msgs.discard(None), tools.discard(None), blobs.discard(None)
    drop_kept(conn, msgs, tools, blobs, chosen.calls, set(chosen.rollouts))
    chosen.messages = {m for m in msgs if isinstance(m, str)}
    chosen.tool_schemas = {t for t in tools if isinstance(t, str)}
    chosen.blobs = {b for b in blobs if isinstance(b, str)}


def drop_kept(conn: sa.Connection, msgs: set, tools: set, blobs: set, calls: set, rollouts: set) -> None:
    """Remove from the sets what a call outside ``calls``, a reward outside ``rollouts`` or a message outside
    ``msgs`` still references (content-addressed rows are shared: only what nothing kept uses may go)."""
    if msgs or tools or blobs:
        q = sa.select(C.c.id, C.c.prompt_tail, C.c.response_message_hash, C.c.tool_schema_hash, C.c.image_hashes)
        for r in conn.execute(q.execution_options(yield_per=2000)):
            if r.id in calls:
                continue
            msgs.difference_update(r.prompt_tail or ())
            msgs.discard(r.response_message_hash)
            tools.discard(r.tool_schema_hash)
            blobs.difference_update(r.image_hashes or ())
    if blobs:
        kept_rewards = sa.select(RW.c.evidence_blob, RW.c.rollout_id).where(RW.c.evidence_blob.is_not(None))
        blobs -= {r.evidence_blob for r in conn.execute(kept_rewards) if r.rollout_id not in rollouts}
        for sha in sorted(blobs):   # an image a kept message still points at
            ref = sa.select(M.c.sha256).where(M.c.body.contains(REF_PREFIX + sha, autoescape=True))
            if any(h not in msgs for h in conn.execute(ref).scalars()):
                blobs.discard(sha)
