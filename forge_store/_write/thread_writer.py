"""``ThreadWriter``: journal first, then batched, idempotent database writes from a thread of this process.

``submit`` returns once the operation is durable in the local journal (``JournalingWriter``); a background thread
batches journaled operations into database transactions (``db_apply.BatchApplier``) and advances the journal
checkpoint about once a second. While the database is unreachable, operations keep landing in the journal; the
writer retries with back-off and drains when it returns. After a crash, everything after the checkpoint is replayed
(apply is idempotent, so a batch that committed just before the crash is harmless to re-apply).

Two threads, one lock:
- the *journaler* takes every operation submitted so far, appends them with one fsync, wakes their submitters and
  hands them, in journal order, to the writer's in-memory queue;
- the *writer* applies that queue in batches. If the queue would grow past ``max_queue`` (a long outage), the
  in-memory copies are dropped and the writer catches up by reading the journal files instead, so memory stays
  bounded however long the database is away (and that is how a journal left by a crash is replayed too).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path

import sqlalchemy as sa

from .._errors import SchemaMismatch
from .db_apply import BatchApplier
from .db_ready import wait_for_schema
from .journal import Journal
from .journal_files import Position
from .journaling_writer import JournalingWriter
from .op_codec import unpack_op

log = logging.getLogger(__name__)


class ThreadWriter(JournalingWriter):
    def __init__(
        self,
        engine: sa.Engine,
        journal: Journal,
        *,
        batch_size: int = 512,
        linger_s: float = 0.005,
        retry_max_s: float = 5.0,
        max_queue: int = 20_000,
        dead_letter_dir: Path | None = None,
        stall_s: float = 10.0,
        check_schema: bool = False,
        auto_upgrade: bool = True,
    ):
        super().__init__(journal, batch_size=batch_size, linger_s=linger_s, retry_max_s=retry_max_s,
                         dead_letter_dir=dead_letter_dir, stall_s=stall_s)
        self.engine, self.max_queue = engine, max_queue
        # opened without its database (open_store(offline=True)): the schema is checked before the first batch
        self._check_schema, self._auto_upgrade = check_schema, auto_upgrade
        self._queue_cv = threading.Condition(self._lock)  # writer: ops journaled
        self._queue: deque[tuple[Position, list[dict]]] = deque()  # journaled groups not yet applied
        self._queued = 0
        self._writer_idle = False
        self._catch_up = self._last != self._applied  # records left by a crash: replay them from the files
        self.checkpoint_every_s = 1.0
        self._checkpointed_at = 0.0
        self._applier = BatchApplier(self.dead_letter_dir, retry_max_s)
        self._start(threading.Thread(target=self._writer, name="forge-store-writer", daemon=True))

    def _journaled(self, pos: Position, ops: list[dict], upto: int) -> None:
        """Hand journaled ops to the database side (caller holds the lock)."""
        self._last = pos  # JournalingWriter._journaled's lines, inline: this runs on every write
        self._marks.append((pos, upto))
        if self._busy_since is None:
            self._busy_since = time.monotonic()
        if self._catch_up or self._queued + len(ops) > self.max_queue:
            self._catch_up = True  # the writer reads these back from the journal files
        else:
            self._queue.append((pos, ops))
            self._queued += len(ops)
        if self._writer_idle:
            self._queue_cv.notify()

    # ---- database side -----------------------------------------------------------------------------------
    def _next_groups(self) -> list[tuple[Position, list[dict]]]:
        with self._lock:
            if not self._queue and not self._catch_up and not self._closing:
                self._writer_idle = True
                while not self._queue and not self._catch_up and not self._closing:
                    self._queue_cv.wait(timeout=1.0)
                self._writer_idle = False
                linger = not self._closing
            else:
                linger = False
        if linger and self.linger_s:
            time.sleep(self.linger_s)  # let a batch gather: fewer transactions, fewer wake-ups
        with self._lock:
            if self._queue:
                return self._take_queued()
            if not self._catch_up:
                return []
            if self._last == self._applied:
                self._catch_up = False
                return []
            until, after = self._last, self._applied
        return self._read_back(after, until)

    def _take_queued(self) -> list[tuple[Position, list[dict]]]:
        """Up to a batch of the in-memory queue (caller holds the lock)."""
        groups, n = [], 0
        while self._queue and n < self.batch_size:
            pos, ops = self._queue.popleft()
            groups.append((pos, ops))
            n += len(ops)
        self._queued -= n
        return groups

    def _read_back(self, after: Position | None, until: Position) -> list[tuple[Position, list[dict]]]:
        """Up to a batch of journaled records after ``after``, read from the journal files (catching up)."""
        groups = []
        for pos, payload in self.journal.replay(after):
            groups.append((pos, [unpack_op(payload)]))
            if pos >= until or len(groups) >= self.batch_size:
                break
        return groups

    def _writer(self) -> None:
        if self._check_schema:
            down = self._applier

            def went_down() -> None:
                down.db_down_since = down.db_down_since or time.monotonic()

            try:
                if not wait_for_schema(self.engine, auto_upgrade=self._auto_upgrade, retry_max_s=self.retry_max_s,
                                       wait=self._wait, down=went_down):
                    return  # closing while the database is away: the journal keeps everything
            except SchemaMismatch as exc:  # nothing is applied: the journal keeps every write until it is fixed
                log.error("the store's writer cannot apply the journal: %s", exc)
                return
            down.db_down_since = None
        while True:
            groups = self._next_groups()
            if not groups:
                with self._lock:
                    if self._closing and not self._queue and not self._catch_up and not self._incoming:
                        return
                continue
            groups = [(pos, ops) for pos, ops in groups if self._applied is None or pos > self._applied]
            if not groups:
                continue
            if self._apply_with_retry([op for _, ops in groups for op in ops]) is False:
                return  # closing while the database is down: the journal keeps everything
            last = groups[-1][0]
            if time.monotonic() - self._checkpointed_at >= self.checkpoint_every_s:
                self.journal.mark_committed(last)  # replay after a crash re-applies at most this much, harmlessly
                self._checkpointed_at = time.monotonic()
            with self._lock:
                self._mark_applied(last, sum(len(ops) for _, ops in groups))

    def _wait(self, delay: float) -> bool:
        """While the database is away: sleep ``delay`` (a close wakes it); False if closing."""
        with self._lock:
            if self._closing:
                return False
            self._queue_cv.wait(timeout=delay)
        return True

    def _apply_with_retry(self, ops: list[dict]) -> bool:
        return self._applier.apply(self.engine, ops, self._wait)

    # ---- status and control --------------------------------------------------------------------------------
    @property
    def db_down_since(self) -> float | None:
        return self._applier.db_down_since or self._stalled_since()

    @property
    def dead_letters(self) -> int:
        return self._applier.dead_letters

    def _signal_closing(self) -> None:
        super()._signal_closing()
        with self._lock:
            self._queue_cv.notify_all()

    def close(self, timeout: float | None = 30.0) -> bool:
        """Stop both threads. Waits up to ``timeout`` for the database; what is left stays in the journal."""
        drained = self.flush(timeout)
        self._signal_closing()
        self._join_threads(timeout)
        if self._applied is not None:
            self.journal.mark_committed(self._applied)
        return drained
