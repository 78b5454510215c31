"""The store's one writer: journal first (group-commit fsync), then batched, idempotent database writes.

``submit`` returns once the operation is durable in the local journal; a background thread batches journaled
operations into database transactions (:func:`forge_store._write.db_apply.apply_ops`) and advances the journal checkpoint
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

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path

import msgpack
import sqlalchemy as sa

from .._errors import InvalidRecord
from .db_apply import apply_ops
from .journal import Journal, Position

log = logging.getLogger("forge_store._write.writer")

TRANSIENT = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DisconnectionError, sa.exc.TimeoutError)


def encode(op: dict) -> bytes:
    """The journal's bytes for ``op``; InvalidRecord for what neither the journal nor a database can hold."""
    try:
        return msgpack.packb(op, datetime=True, use_bin_type=True)
    except UnicodeEncodeError as exc:  # a lone surrogate ("\\ud800"): a Python string may hold one, UTF-8 cannot
        bad, around = exc.object[exc.start:exc.end], exc.object[max(0, exc.start - 20):exc.start + 20]
        raise InvalidRecord(f"{op.get('k')} record holds text that is not valid Unicode ({bad!r} in {around!r}); "
                            "replace it, e.g. with text.encode('utf-8', 'replace').decode()") from None
    except TypeError as exc:  # a value JSON and the journal have no form for (a set, an object)
        raise InvalidRecord(f"{op.get('k')} record holds a value the store cannot keep ({exc}); "
                            "use JSON types") from None


def decode(payload: bytes) -> dict:
    return msgpack.unpackb(payload, timestamp=3, raw=False, strict_map_key=False)


class BatchApplier:
    """Applies batches of operations in one transaction each: while the database is unreachable it retries with
    back-off (``wait(delay)`` sleeps and says whether to go on); an operation the database rejects for good is
    isolated by halving the batch and kept in ``dead_letter_dir``, so one bad row never blocks or drops the rest."""

    def __init__(self, dead_letter_dir: Path, retry_max_s: float):
        self.dead_letter_dir, self.retry_max_s = dead_letter_dir, retry_max_s
        self.db_down_since: float | None = None
        self.dead_letters = 0

    def apply(self, engine: sa.Engine, ops: list[dict], wait) -> bool:
        """True once ``ops`` are in the database (or dead-lettered); False if ``wait`` said to give up."""
        delay = 0.05
        while True:
            try:
                with engine.begin() as conn:
                    apply_ops(conn, ops)
                if self.db_down_since is not None:
                    log.warning("database is back after %.1fs; draining the journal", time.monotonic() - self.db_down_since)
                    self.db_down_since = None
                return True
            except TRANSIENT as exc:
                if self.db_down_since is None:
                    self.db_down_since = time.monotonic()
                    log.warning("database unreachable (%s); writes stay in the journal and will drain", exc.__class__.__name__)
                if not wait(delay):
                    return False
                delay = min(delay * 2, self.retry_max_s)
            except (sa.exc.DBAPIError, InvalidRecord):  # the database refused it, or a value cannot be stored
                if len(ops) == 1:
                    self._dead_letter(ops[0])
                    return True
                mid = len(ops) // 2  # find the poison operation, keep the rest
                return self.apply(engine, ops[:mid], wait) and self.apply(engine, ops[mid:], wait)

    def _dead_letter(self, op: dict) -> None:
        """An operation the database rejects for good: keep it on disk, loudly, rather than block or drop it."""
        self.dead_letter_dir.mkdir(parents=True, exist_ok=True)
        path = self.dead_letter_dir / f"{time.time_ns()}-{op.get('k')}.msgpack"
        path.write_bytes(encode(op))
        self.dead_letters += 1
        log.error("database rejected a %s write; kept in %s for inspection", op.get("k"), path)


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
        self._applier = BatchApplier(self.dead_letter_dir, retry_max_s)
        self.batches = self.applied_ops = 0
        self._threads = [self._database_side()]
        if journal.fsync:  # group commit needs its own thread; kernel writes happen in submit()
            self._threads.append(threading.Thread(target=self._journaler, name="forge-store-journaler", daemon=True))
        for t in self._threads:
            t.start()

    def _database_side(self) -> threading.Thread:
        return threading.Thread(target=self._writer, name="forge-store-writer", daemon=True)

    # ---- submit side -------------------------------------------------------------------------------------
    def submit(self, op: dict) -> Future:
        """Queue ``op`` for the journal; the returned future resolves once it is durable there.

        Without fsync the record is written to the kernel right here (it then survives kill -9 of this process):
        a thread hop would cost more than the write.
        """
        fut: Future = Future()
        if not self.journal.fsync:
            fut.set_result(self.journal_now(op))
            return fut
        payload = encode(op)
        with self._lock:
            if self._closing:
                raise RuntimeError("store is closed: open it again to write")
            self._incoming.append((op, payload, fut))
            self._submitted += 1
            self._incoming_cv.notify()
        return fut

    def journal_now(self, op: dict) -> Position:
        """Without fsync: write ``op`` to the journal (the kernel) in the calling thread and return its position;
        ``submit`` without the future (an event loop's caller needs no thread hop and no lock-backed future)."""
        payload = encode(op)
        with self._lock:
            if self._closing:
                raise RuntimeError("store is closed: open it again to write")
            pos = self.journal.write_now([payload])
            self._submitted += 1
            self._journaled(pos, [op], self._submitted)
        return pos

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
                self._mark_applied(last, sum(len(ops) for _, ops in groups))

    def _mark_applied(self, last: Position, n_ops: int) -> None:
        """A batch through ``last`` is in the database: advance what ``flush`` waits for (caller holds the lock)."""
        self._applied = last
        while self._marks and self._marks[0][0] <= last:
            self._applied_n = self._marks.popleft()[1]
        self.batches += 1
        self.applied_ops += n_ops
        self._applied_cv.notify_all()

    def _apply_with_retry(self, ops: list[dict]) -> bool:
        def wait(delay: float) -> bool:
            with self._lock:
                if self._closing and self._give_up_on_close:
                    return False
                self._queue_cv.wait(timeout=delay)
            return True

        return self._applier.apply(self.engine, ops, wait)

    @property
    def db_down_since(self) -> float | None:
        return self._applier.db_down_since

    @property
    def dead_letters(self) -> int:
        return self._applier.dead_letters

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

    def _signal_closing(self) -> None:
        with self._lock:
            self._closing = True
            self._give_up_on_close = True
            for cv in (self._incoming_cv, self._queue_cv, self._applied_cv):
                cv.notify_all()

    def close(self, timeout: float | None = 30.0) -> bool:
        """Stop both threads. Waits up to ``timeout`` for the database; what is left stays in the journal."""
        drained = self.flush(timeout)
        self._signal_closing()
        for t in self._threads:
            t.join(timeout=max(timeout or 0, 5.0))
        if self._applied is not None:
            self.journal.mark_committed(self._applied)
        return drained


class ProcessWriter(Writer):
    """A ``Writer`` whose database side runs in a child process (``python -m forge_store._write.drain_process``).

    For the proxy: its event loop only journals (a kernel write), and the SQL that turns journal entries into rows
    runs in another process, so it neither takes the GIL from the loop nor its CPU. The child tails the journal
    files from the checkpoint, applies batches (same ``apply_ops``, retries and dead letters as the thread), saves
    the checkpoint and reports each applied position on its stdout; ``flush`` waits for those reports. A child that
    dies is restarted (it resumes from the checkpoint; applying is idempotent); a parent that dies closes the
    child's stdin, and the child stops after its current batch. Durability is unchanged: a write is acknowledged
    once it is in the journal.
    """

    def __init__(self, engine: sa.Engine, journal: Journal, *, url: str, linger_s: float = 0.05, **kwargs):
        self._url = url
        self._proc: subprocess.Popen | None = None
        self._pipe_lock = threading.Lock()
        self._db_down_at: float | None = None
        self._dead = self._dead_base = 0  # dead letters: all children / before the current child started
        self.restarts = 0
        super().__init__(engine, journal, linger_s=linger_s, **kwargs)

    def _database_side(self) -> threading.Thread:
        return threading.Thread(target=self._supervise, name="forge-store-drain", daemon=True)

    def _journaled(self, pos: Position, ops: list[dict], upto: int) -> None:
        self._last = pos
        self._marks.append((pos, upto))

    @property
    def db_down_since(self) -> float | None:
        return self._db_down_at

    @property
    def dead_letters(self) -> int:
        return self._dead

    def pending_ops(self) -> int:
        with self._lock:
            return self._submitted - self._applied_n

    def _spawn(self) -> subprocess.Popen:
        env = {**os.environ, "OPENFORGE_DRAIN_URL": self._url, "PYTHONPATH": os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")) if p)}
        argv = [sys.executable, "-m", "forge_store._write.drain_process", "--journal", str(self.journal.directory),
                "--batch-size", str(self.batch_size), "--linger", str(self.linger_s),
                "--retry-max", str(self.retry_max_s), "--dead-letter", str(self.dead_letter_dir)]
        if self.journal.fsync:
            argv.append("--fsync")
        # its own session: a Ctrl-C at the terminal reaches the proxy, which then drains and stops the child
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True)

    def _supervise(self) -> None:
        backoff = 0.5
        while True:
            with self._lock:
                if self._closing:
                    return
                self._proc = proc = self._spawn()
            for line in proc.stdout:
                self._report(line.split())
                backoff = 0.5
            rc = proc.wait()
            with self._lock:
                if self._closing:
                    return
            log.warning("the store's drain process exited with status %s; restarting it in %.1fs (journaled writes "
                        "wait for it, nothing is lost)", rc, backoff)
            self.restarts += 1
            time.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    def _report(self, words: list[bytes]) -> None:
        if not words:
            return
        kind = words[0]
        with self._lock:
            if kind == b"a":  # applied through a position
                self._mark_applied(Position(int(words[1]), int(words[2])), int(words[3]))
            elif kind == b"d":  # database down (1) or back (0)
                self._db_down_at = time.monotonic() if words[1] == b"1" else None
            elif kind == b"x":  # dead letters so far (this child)
                self._dead = self._dead_base + int(words[1])
            elif kind == b"s":  # a (re)started child: its dead-letter count starts at zero
                self._dead_base = self._dead

    def _tell(self, command: bytes) -> None:
        with self._pipe_lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                return
            try:
                proc.stdin.write(command)
                proc.stdin.flush()
            except (ValueError, OSError):  # the child is gone (the supervisor restarts it) or its pipe closed
                pass

    def flush(self, timeout: float | None = None) -> bool:
        self._tell(b"f\n")  # apply now rather than after the batch linger
        return super().flush(timeout)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Wait up to ``timeout`` for the database, stop the child (it saves the checkpoint) and the threads."""
        drained = self.flush(timeout)
        self._signal_closing()
        self._tell(b"q\n" if drained else b"Q\n")
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(timeout=max(timeout or 0, 5.0))
            except subprocess.TimeoutExpired:
                log.warning("the store's drain process did not stop; killing it (the journal keeps its writes)")
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError, ValueError):
                    stream.close()
        for t in self._threads:
            t.join(timeout=max(timeout or 0, 5.0))
        return drained
