"""The store's one writer: journal first (group-commit fsync), then batched, idempotent database writes.

``submit`` returns once the operation is durable in the local journal; a background thread batches journaled
operations into database transactions (:func:`forge_store.apply.apply_ops`) and advances the journal checkpoint
after each commit. While the database is unreachable, operations keep landing in the journal; the writer retries
with back-off and drains when it returns. After a crash, everything after the checkpoint is replayed (apply is
idempotent, so a batch that committed just before the crash is harmless to re-apply).

Two threads, one lock:
- the *journaler* takes every operation submitted so far, appends them with one fsync, wakes their submitters and
  hands them, in journal order, to the writer's in-memory queue;
- the *writer* applies that queue in batches. If the queue would grow past ``max_queue`` (a long outage), the
  in-memory copies are dropped and the writer catches up by reading the journal files instead, so memory stays
  bounded however long the database is away.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path

import msgpack
import sqlalchemy as sa

from .apply import apply_ops
from .journal import Journal, Position

log = logging.getLogger("forge_store.writer")

TRANSIENT = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DisconnectionError, sa.exc.TimeoutError)


def encode(op: dict) -> bytes:
    return msgpack.packb(op, datetime=True, use_bin_type=True)


def decode(payload: bytes) -> dict:
    return msgpack.unpackb(payload, timestamp=3, raw=False, strict_map_key=False)


class Writer:
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
    ):
        self.engine, self.journal = engine, journal
        self.batch_size, self.linger_s, self.retry_max_s, self.max_queue = batch_size, linger_s, retry_max_s, max_queue
        self._writer_idle = False
        self.dead_letter_dir = dead_letter_dir or Path(journal.directory) / "dead-letter"
        self._lock = threading.Lock()
        # one lock, three wait queues: nobody is woken for news that is not theirs
        self._incoming_cv = threading.Condition(self._lock)  # journaler: ops submitted
        self._queue_cv = threading.Condition(self._lock)  # writer: ops journaled
        self._applied_cv = threading.Condition(self._lock)  # flush(): ops in the database
        self._incoming: list[tuple[dict, bytes, Future]] = []
        self._queue: deque[tuple[Position, list[dict]]] = deque()  # journaled groups not yet applied
        self._queued = 0
        self._applied: Position | None = journal.committed()
        self._last: Position | None = self._applied
        self._catch_up = False
        for pos, _ in journal.pending():  # anything journaled but not applied before a crash: replay from disk
            self._last, self._catch_up = pos, True
        self._submitted = self._applied_n = 0  # ops submitted by this process / of those, in the database
        self._marks: deque[tuple[Position, int]] = deque()  # (journal position, ops submitted up to it)
        self._closing = False
        self._give_up_on_close = False
        self.checkpoint_every_s = 1.0
        self._checkpointed_at = 0.0
        self.db_down_since: float | None = None
        self.batches = self.applied_ops = self.dead_letters = 0
        self._threads = [threading.Thread(target=self._writer, name="forge-store-writer", daemon=True)]
        if journal.fsync:  # group commit needs its own thread; kernel writes happen in submit()
            self._threads.append(threading.Thread(target=self._journaler, name="forge-store-journaler", daemon=True))
        for t in self._threads:
            t.start()

    # ---- submit side -------------------------------------------------------------------------------------
    def submit(self, op: dict) -> Future:
        """Queue ``op`` for the journal; the returned future resolves once it is durable there.

        Without fsync the record is written to the kernel right here (it then survives kill -9 of this process):
        a thread hop would cost more than the write.
        """
        fut: Future = Future()
        payload = encode(op)
        if not self.journal.fsync:
            with self._lock:
                if self._closing:
                    raise RuntimeError("store is closed: open it again to write")
                pos = self.journal.write_now([payload])
                self._submitted += 1
                self._journaled(pos, [op], self._submitted)
            fut.set_result(pos)
            return fut
        with self._lock:
            if self._closing:
                raise RuntimeError("store is closed: open it again to write")
            self._incoming.append((op, payload, fut))
            self._submitted += 1
            self._incoming_cv.notify()
        return fut

    def _journaler(self) -> None:
        while True:
            with self._lock:
                while not self._incoming and not self._closing:
                    self._incoming_cv.wait()
                if not self._incoming and self._closing:
                    return
                batch, self._incoming = self._incoming, []
                upto = self._submitted
            try:
                pos = self.journal.append_many([payload for _, payload, _ in batch])
            except BaseException as exc:  # the journal disk failed: nobody may be told their write is safe
                log.exception("journal append failed; %d writes not acknowledged", len(batch))
                with self._lock:
                    self._submitted -= len(batch)  # never journaled: nothing for flush() to wait for
                for _, _, fut in batch:
                    fut.set_exception(exc)
                continue
            with self._lock:
                self._journaled(pos, [op for op, _, _ in batch], upto)
            for _, _, fut in batch:
                fut.set_result(pos)

    def _journaled(self, pos: Position, ops: list[dict], upto: int) -> None:
        """Hand journaled ops to the database side (caller holds the lock)."""
        self._last = pos
        self._marks.append((pos, upto))
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
                groups, n = [], 0
                while self._queue and n < self.batch_size:
                    pos, ops = self._queue.popleft()
                    groups.append((pos, ops))
                    n += len(ops)
                self._queued -= n
                return groups
            if not self._catch_up:
                return []
            if self._last == self._applied:
                self._catch_up = False
                return []
            until, after = self._last, self._applied
        groups = []
        for pos, payload in self.journal.replay(after):
            groups.append((pos, [decode(payload)]))
            if pos >= until or len(groups) >= self.batch_size:
                break
        return groups

    def _writer(self) -> None:
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
                self._applied = last
                while self._marks and self._marks[0][0] <= last:
                    self._applied_n = self._marks.popleft()[1]
                self.batches += 1
                self.applied_ops += sum(len(ops) for _, ops in groups)
                self._applied_cv.notify_all()

    def _apply_with_retry(self, ops: list[dict]) -> bool:
        delay = 0.05
        while True:
            try:
                with self.engine.begin() as conn:
                    apply_ops(conn, ops)
                if self.db_down_since is not None:
                    log.warning("database is back after %.1fs; draining the journal", time.monotonic() - self.db_down_since)
                    self.db_down_since = None
                return True
            except TRANSIENT as exc:
                if self.db_down_since is None:
                    self.db_down_since = time.monotonic()
                    log.warning("database unreachable (%s); writes stay in the journal and will drain", exc.__class__.__name__)
                with self._lock:
                    if self._closing and self._give_up_on_close:
                        return False
                    self._queue_cv.wait(timeout=delay)
                delay = min(delay * 2, self.retry_max_s)
            except sa.exc.DBAPIError:
                if len(ops) == 1:
                    self._dead_letter(ops[0])
                    return True
                mid = len(ops) // 2  # find the poison operation, keep the rest
                return self._apply_with_retry(ops[:mid]) and self._apply_with_retry(ops[mid:])

    def _dead_letter(self, op: dict) -> None:
        """An operation the database rejects for good: keep it on disk, loudly, rather than block or drop it."""
        self.dead_letter_dir.mkdir(parents=True, exist_ok=True)
        path = self.dead_letter_dir / f"{time.time_ns()}-{op.get('k')}.msgpack"
        path.write_bytes(encode(op))
        self.dead_letters += 1
        log.error("database rejected a %s write; kept in %s for inspection", op.get("k"), path)

    # ---- control ------------------------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far is in the database. False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            target, last = self._submitted, self._last
            while self._applied_n < target or (last is not None and (self._applied is None or self._applied < last)):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._applied_cv.wait(timeout=remaining if remaining is not None else 1.0)
        return True

    def pending_ops(self) -> int:
        with self._lock:
            return self._queued + len(self._incoming)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Stop both threads. Waits up to ``timeout`` for the database; what is left stays in the journal."""
        drained = self.flush(timeout)
        with self._lock:
            self._closing = True
            self._give_up_on_close = True
            for cv in (self._incoming_cv, self._queue_cv, self._applied_cv):
                cv.notify_all()
        for t in self._threads:
            t.join(timeout=max(timeout or 0, 5.0))
        if self._applied is not None:
            self.journal.mark_committed(self._applied)
        return drained
