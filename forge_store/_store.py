"""``Store``: the one API through which every part writes to and reads from the lineage store.

Writes are idempotent by id and go through the durable journal and the batched writer (journal mode, the
default for long-running writers such as the proxy and the orchestrator) or straight into the database
(``journal=False``: CLIs, notebooks, tests). Either way they return once the write is durable.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import OrderedDict
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from . import _migrate as migrate
from . import _schema as schema
from ._blobs import BlobStore, open_blob_store
from ._call_draft import CallDraft
from ._engine import create_engine, redact_url
from ._errors import InvalidRecord, StoreUnavailable
from ._hashing import json_sha256, sha256_hex
from ._records import EXCLUSION_REASONS, OUTCOMES, REWARD_SOURCES, CallRecord
from ._settings import Settings, get_settings
from ._store_reads import StoreReads
from ._write.call_encoder import CallEncoder
from ._write.db_apply import apply_ops, check_lengths
from ._write.journal import Journal
from ._write.op_codec import pack_op
from ._write.process_writer import ProcessWriter
from ._write.prompt_cache import Prepare as Redact
from ._write.thread_writer import ThreadWriter

log = logging.getLogger("forge_store")


def _new_id() -> str:
    return uuid.uuid4().hex


def _check(value, allowed, what: str) -> None:
    if value not in allowed:
        raise InvalidRecord(f"{what} {value!r} is not one of {', '.join(allowed)}")


class Store(StoreReads):
    def __init__(self, engine: sa.Engine, blobs: BlobStore, *, journal: Journal | None, settings: Settings,
                 drain: str = "thread", schema_checked: bool = True):
        self.engine, self.blobs, self.settings = engine, blobs, settings
        self.url = redact_url(engine.url.render_as_string(hide_password=False))
        self._encoder = CallEncoder()
        self._known_blobs: OrderedDict[str, None] = OrderedDict()
        self._writer = None
        if drain not in ("thread", "process"):
            raise ValueError(f"drain={drain!r}: use 'thread' (database writes in this process) or 'process'")
        if journal is not None and drain == "process":  # the drain process checks the schema itself
            self._writer = ProcessWriter(
                journal, url=engine.url.render_as_string(hide_password=False),
                batch_size=settings.writer_batch_size, linger_s=settings.drain_linger_s,
                retry_max_s=settings.writer_retry_max_s, stall_s=settings.writer_stall_s,
                auto_upgrade=settings.auto_upgrade,
            )
        elif journal is not None:
            self._writer = ThreadWriter(
                engine, journal, batch_size=settings.writer_batch_size, linger_s=settings.writer_linger_s,
                retry_max_s=settings.writer_retry_max_s, stall_s=settings.writer_stall_s,
                check_schema=not schema_checked, auto_upgrade=settings.auto_upgrade,
            )
        self._store_id: str | None = None
        if schema_checked:
            self._store_id = self.store_id

    @property
    def store_id(self) -> str:
        """The store's identity (a row of the database: read on first use by a store opened without it)."""
        if self._store_id is None:
            with self.engine.connect() as conn:
                self._store_id = conn.execute(
                    sa.select(schema.StoreMeta.value).where(schema.StoreMeta.key == "store_id")
                ).scalar_one()
        return self._store_id

    # ---- writes -------------------------------------------------------------------------------------------
    def _write(self, op: dict) -> None:
        if op["k"] != "call":  # a call's were checked by the encoder, before it changed its state
            check_lengths(op)
        if self._writer is None:
            pack_op(op)  # what a journal could not hold is refused here too (InvalidRecord), whatever the database says
            with self.engine.begin() as conn:
                apply_ops(conn, [op])
        else:
            self._writer.submit(op).result()

    def record_call(self, rec: CallRecord) -> str:
        """Record one model call; returns its id. Recording the same id again leaves one row."""
        return CallDraft(self._encoder, self._writer, self._write, None, rec).finish_now()

    def begin_call(self, rollout_id: str | None, messages: list, tools: list | None = None, *,
                   redact: Redact | None = None) -> CallDraft:
        """One model call as one unit of work: ``draft.start(...)`` while the upstream works, ``await
        draft.finish()`` once its answer (or error) is in the record (see ``forge_store._call_draft``).

        ``messages`` / ``tools``: the prompt as the client sent it, compared here with the rollout's previous prompt
        (cheap; reused copies and hashes make a call cost O(new messages)). The stored copies move inline images to
        the blob store, then apply ``redact(value, marks)`` (the stored form of a message or of the tool list; it
        adds the rules that fired to ``marks``) to each new message and to the tool schemas."""
        prompt = self._encoder.prompt(rollout_id, messages, tools, put_blob=self.put_blob, prepare=redact)
        return CallDraft(self._encoder, self._writer, self._write, prompt)

    def forget_rollout(self, rollout_id: str) -> None:
        """The rollout makes no more calls through this store: drop what recording them kept in memory (its last
        prompt and delta base). ``finish_rollout`` does it too; a later call of the rollout would only be stored
        whole, not as a delta."""
        self._encoder.forget(rollout_id)

    def register_task(self, id: str, *, source=None, domain=None, instruction_hash=None, verifier_hash=None,
                      environment_ref=None, metadata=None, created_at: datetime | None = None) -> str:
        self._write({"k": "task", "r": dict(id=id, source=source, domain=domain, instruction_hash=instruction_hash,
                                           verifier_hash=verifier_hash, environment_ref=environment_ref,
                                           metadata=metadata, created_at=created_at or schema.utcnow())})
        return id

    def register_task_version(self, id: str, *, task_id: str, instruction_hash: str, verifier_hash: str, files: dict,
                              config_hash=None, environment_hash=None, solution_hash=None, source=None, lineage=None,
                              metadata=None) -> str:
        """A task version, keyed by its content address (``rollout`` computes it); idempotent: the first
        registration of an id (and its lineage) is the one kept."""
        self._write({"k": "task_version", "r": dict(
            id=id, task_id=task_id, instruction_hash=instruction_hash, config_hash=config_hash,
            environment_hash=environment_hash, verifier_hash=verifier_hash, solution_hash=solution_hash, files=files,
            source=source, lineage=lineage, metadata=metadata, created_at=schema.utcnow())})
        return id

    def register_harness(self, name: str, version: str | None = None, config: dict | None = None) -> str:
        """Harness rows are keyed by name, version and config hash; the id is derived, so this is idempotent."""
        config_hash = json_sha256(config) if config is not None else None
        hid = f"{name}@{version or 'unknown'}" + (f"#{config_hash[:12]}" if config_hash else "")
        self._write({"k": "harness", "r": dict(id=hid, name=name, version=version, config_hash=config_hash,
                                              config=config, created_at=schema.utcnow())})
        return hid

    def register_policy_version(self, id: str, *, model_name: str, checkpoint_id=None, checkpoint_hash=None,
                                global_step=None, tokenizer_hash=None, chat_template_hash=None, engine=None,
                                engine_version=None, sampling_defaults=None, metadata=None) -> str:
        self._write({"k": "policy_version", "r": dict(
            id=id, model_name=model_name, checkpoint_id=checkpoint_id, checkpoint_hash=checkpoint_hash,
            global_step=global_step, tokenizer_hash=tokenizer_hash, chat_template_hash=chat_template_hash,
            engine=engine, engine_version=engine_version, sampling_defaults=sampling_defaults, metadata=metadata,
            created_at=schema.utcnow())})
        return id

    def create_run(self, id: str | None = None, *, name: str | None = None, config: dict | None = None) -> str:
        id = id or _new_id()
        self._write({"k": "run", "r": dict(id=id, name=name, config=config, created_at=schema.utcnow())})
        return id

    def create_group(self, id: str | None = None, *, task_id: str, target_size: int, run_id: str | None = None,
                     policy_version_id: str | None = None) -> str:
        if target_size < 1:
            raise InvalidRecord(f"group target_size {target_size}: a group needs at least 1 rollout")
        id = id or _new_id()
        self._write({"k": "group", "r": dict(id=id, run_id=run_id, task_id=task_id, policy_version_id=policy_version_id,
                                            target_size=target_size, created_at=schema.utcnow())})
        return id

    def start_rollout(self, id: str | None = None, *, group_id=None, run_id=None, task_id=None, harness_id=None,
                      policy_version_id=None, backend=None, image_ref=None, image_digest=None, pod_name=None,
                      node_name=None, attempt: int = 1, retry_of=None, metadata=None,
                      started_at: datetime | None = None, task_version_id: str | None = None) -> str:
        id = id or _new_id()
        self._write({"k": "rollout_start", "r": dict(
            id=id, group_id=group_id, run_id=run_id, task_id=task_id, harness_id=harness_id,
            policy_version_id=policy_version_id, backend=backend, image_ref=image_ref, image_digest=image_digest,
            pod_name=pod_name, node_name=node_name, attempt=attempt, retry_of=retry_of, status="running",
            metadata=metadata, started_at=started_at or schema.utcnow(), task_version_id=task_version_id)})
        return id

    def finish_rollout(self, id: str, outcome: str, *, detail: str | None = None, ended_at: datetime | None = None,
                       image_digest=None, pod_name=None, node_name=None) -> None:
        """Mark a rollout finished with an outcome of the taxonomy. The first finish wins; later ones change nothing."""
        _check(outcome, OUTCOMES, "rollout outcome")
        self._write({"k": "rollout_finish", "r": dict(
            id=id, outcome=outcome, outcome_detail=detail, ended_at=ended_at or schema.utcnow(),
            image_digest=image_digest, pod_name=pod_name, node_name=node_name)})
        self._encoder.forget(id)

    def add_reward(self, rollout_id: str, value: float, *, source: str = "verifier", verifier_version=None,
                   evidence_blob=None, detail=None, id: str | None = None) -> str:
        """Append a reward. Never overwrites: a second reward for a rollout is a second row."""
        _check(source, REWARD_SOURCES, "reward source")
        value = float(value)
        if value != value:
            raise InvalidRecord(f"reward for rollout {rollout_id} is NaN: a verifier that cannot score is an infra error")
        if not math.isfinite(value):
            raise InvalidRecord(f"reward for rollout {rollout_id} is {value}: a reward is a finite number; clip it "
                                "in the verifier (GRPO's group statistics are undefined with an infinite reward)")
        id = id or _new_id()
        self._write({"k": "reward", "r": dict(id=id, rollout_id=rollout_id, value=value, source=source,
                                             verifier_version=verifier_version, evidence_blob=evidence_blob,
                                             detail=detail, created_at=schema.utcnow())})
        return id

    def add_event(self, kind: str, *, source: str, rollout_id: str | None = None, detail: dict | None = None,
                  time: datetime | None = None, id: str | None = None) -> str:
        id = id or _new_id()
        self._write({"k": "event", "r": dict(id=id, rollout_id=rollout_id, kind=kind, source=source,
                                            time=time or schema.utcnow(), detail=detail)})
        return id

    def add_exclusion(self, reason: str, *, rollout_id: str | None = None, call_id: str | None = None,
                      detail: dict | None = None, export_id: str | None = None, id: str | None = None) -> str:
        _check(reason, EXCLUSION_REASONS, "exclusion reason")
        if rollout_id is None and call_id is None:
            raise InvalidRecord("an exclusion names what it excludes: pass rollout_id, call_id or both")
        id = id or _new_id()
        self._write({"k": "exclusion", "r": dict(id=id, rollout_id=rollout_id, call_id=call_id, reason=reason,
                                                detail=detail, export_id=export_id, created_at=schema.utcnow())})
        return id

    def record_export(self, id: str, *, format: str, watermark: int, query: str | None = None,
                      out_dir: str | None = None, manifest: dict | None = None, counts: dict | None = None) -> str:
        self._write({"k": "export", "r": dict(id=id, format=format, query=query, watermark=watermark,
                                             out_dir=out_dir, manifest=manifest, counts=counts,
                                             created_at=schema.utcnow())})
        return id

    def put_blob(self, data: bytes, media_type: str | None = None) -> str:
        """Store bytes once under their sha256 and index them; returns the hash.

        The bytes are durable when this returns. The index row rides the journal without waiting for its own
        fsync: any call that references the blob is journaled after it and waits for that, which covers both.
        """
        sha = sha256_hex(data)
        if sha in self._known_blobs:
            return sha
        self.blobs.put(data)
        op = {"k": "blob", "r": dict(sha256=sha, size=len(data), media_type=media_type)}
        if self._writer is None:
            self._write(op)
        else:
            self._writer.submit(op)
        self._known_blobs[sha] = None
        if len(self._known_blobs) > 100_000:
            self._known_blobs.popitem(last=False)
        return sha

    # ---- reads: inherited from StoreReads (forge_store/_store_reads.py) ----------------------------------------
    def known_call_ids(self, ids: list[str]) -> set[str]:
        """Which of ``ids`` are stored calls (to check that every call a client was answered arrived)."""
        found: set[str] = set()
        with self._reading() as conn:
            for i in range(0, len(ids), 500):
                found.update(conn.execute(sa.select(schema.Call.id).where(schema.Call.id.in_(ids[i:i + 500])))
                             .scalars())
        return found

    # ---- lifecycle ----------------------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every write so far is in the database (not only the journal). False on timeout."""
        return True if self._writer is None else self._writer.flush(timeout)

    def writer_status(self) -> dict:
        if self._writer is None:
            return {"mode": "direct"}
        w = self._writer
        return {"mode": "journal", "drain": "process" if isinstance(w, ProcessWriter) else "thread",
                "pending_ops": w.pending_ops(), "batches": w.batches, "applied_ops": w.applied_ops,
                "dead_letters": w.dead_letters,
                "db_down_s": None if w.db_down_since is None else time.monotonic() - w.db_down_since}

    def close(self, timeout: float | None = 30.0) -> None:
        """Drain to the database (up to ``timeout``), stop the writer, close the journal. Idempotent."""
        if self._writer is not None:
            if not self._writer.close(timeout):
                log.warning("closed with writes still only in the journal; they are replayed on the next open")
            self._writer.journal.close()
            self._writer = None
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_store(url: str | None = None, *, journal: bool = False, name: str = "default",
               settings: Settings | None = None, blobs: BlobStore | None = None, drain: str = "thread",
               offline: bool = False) -> Store:
    """Open the store at ``url`` (default: the embedded SQLite under ``OPENFORGE_HOME``).

    ``journal=True`` gives a long-running writer its own durable journal (one process per journal ``name``);
    ``drain="process"`` moves the journal's database writes into a child process (the proxy's choice: its event
    loop then only journals), ``"thread"`` keeps them in a thread of this process.
    An empty database gets the schema (unless ``auto_upgrade`` is off); any other revision than this code's head
    is an error that says what to run.

    ``offline=True`` (with ``journal=True``; the proxy's choice) opens the store even while the database is
    unreachable: writes are journaled as always, the writer checks the schema when the database answers, before
    its first batch, and reads raise until then. Without it, an unreachable database is ``StoreUnavailable``.
    """
    if offline and not journal:
        raise ValueError("open_store(offline=True) needs journal=True: without a journal no write can be kept while "
                         "the database is away")
    settings = settings or get_settings()
    url = url or settings.resolved_store_url()
    engine = create_engine(url)
    checked = True
    try:
        migrate.check(engine, redact_url(url), auto_upgrade=settings.auto_upgrade)
    except sa.exc.OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        if offline:
            log.warning("the database at %s is unreachable (%s): writes go to the journal and drain when it is "
                        "back; the schema is checked then", redact_url(url), reason)
            checked = False
        else:
            engine.dispose()
            raise StoreUnavailable(
                f"cannot open the store at {redact_url(url)}: {reason}. Check the URL, that the server is running, "
                "and that the database exists (createdb NAME), then retry."
            ) from None
    except BaseException:
        engine.dispose()
        raise
    blob_store = blobs or open_blob_store(settings)
    jr = None
    if journal:
        jr = Journal(Path(settings.resolved_journal_dir(name)), fsync=settings.journal_fsync)
    try:
        return Store(engine, blob_store, journal=jr, settings=settings, drain=drain, schema_checked=checked)
    except BaseException:
        if jr is not None:
            jr.close()
        raise
