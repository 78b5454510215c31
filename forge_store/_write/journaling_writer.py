"""``JournalingWriter``: the half both of the store's writers share, the half that journals.

``submit`` packs an operation (``op_codec``) and returns a future that resolves once the operation is durable in
the journal; with fsync on, a *journaler* thread takes every operation submitted so far and appends them with one
fsync (group commit), without fsync ``journal_now`` writes to the kernel in the caller's thread. A subclass's
database side applies what is journaled and reports each applied position (``_mark_applied``); ``flush`` waits
for those reports. ``ThreadWriter`` applies in a thread of this process, ``ProcessWriter`` in a child process.

Journal positions and counts: ``_marks`` pairs each journaled position with how many operations this process had
submitted up to it, so that ``flush`` can wait for "everything submitted so far", including what a previous
process left in the journal (``_last`` starts at the last pending record).

Health: ``pending_ops`` counts what is journaled (or on its way) and not yet in the database, a previous process's
records included; ``db_down_since`` is when the database side last made progress while work waited, once it has
made none for ``stall_s`` (a database that stalls rather than refuses: an apply that never returns), or the time
the database side itself reported it unreachable, whichever it knows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path

from .journal import Journal
from .journal_files import Position
from .op_codec import pack_op

log = logging.getLogger(__name__)


class JournalingWriter:
    """Journal first, acknowledge, then let a database side apply; a subclass supplies the database side (one
    thread, passed to ``_start``) and ``db_down_since``, ``dead_letters`` and ``close``."""

    def __init__(self, journal: Journal, *, batch_size: int, linger_s: float, retry_max_s: float,
                 dead_letter_dir: Path | None, stall_s: float = 10.0):
        self.journal = journal
        self.batch_size, self.linger_s, self.retry_max_s = batch_size, linger_s, retry_max_s
        self.dead_letter_dir = dead_letter_dir or Path(journal.directory) / "dead-letter"
        self._lock = threading.Lock()
        # one lock, one wait queue per kind of news: nobody is woken for news that is not theirs
        self._incoming_cv = threading.Condition(self._lock)  # journaler: ops submitted
        self._applied_cv = threading.Condition(self._lock)  # flush(): ops in the database
        self._incoming: list[tuple[dict, bytes, Future]] = []
        self._applied: Position | None = journal.committed()
        self._last: Position | None = self._applied
        self._backlog = 0  # records a previous process left unapplied
        for pos, _ in journal.pending():  # anything journaled but not applied before a crash: flush waits for it
            self._last = pos
            self._backlog += 1
        self.stall_s = stall_s
        self._busy_since: float | None = time.monotonic() if self._backlog else None  # work waiting, no progress
        self._submitted = self._applied_n = 0  # ops submitted by this process / of those, in the database
        self._marks: deque[tuple[Position, int]] = deque()  # (journal position, ops submitted up to it)
        self._closing = False
        self.batches = self.applied_ops = 0
        self._threads: list[threading.Thread] = []

    def _start(self, database_side: threading.Thread) -> None:
        """Start the database side and, with fsync on, the journaler (group commit needs its own thread; without
        fsync the kernel writes happen in ``submit``)."""
        self._threads = [database_side]
        if self.journal.fsync:
            self._threads.append(threading.Thread(target=self._journaler, name="forge-store-journaler", daemon=True))
        for t in self._threads:
            t.start()

    # ---- the journaling side ------------------------------------------------------------------------------
    def submit(self, op: dict) -> Future:
        """Queue ``op`` for the journal; the returned future resolves once it is durable there.

        Without fsync the record is written to the kernel right here (it then survives kill -9 of this process):
        a thread hop would cost more than the write.
        """
        fut: Future = Future()
        if not self.journal.fsync:
            fut.set_result(self.journal_now(op))
            return fut
        payload = pack_op(op)
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
        payload = pack_op(op)
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
        """``ops`` are in the journal through ``pos`` (caller holds the lock): what ``flush`` waits for grows. A
        database side that reads the journal files needs nothing else; one that takes ``ops`` in memory overrides
        this."""
        self._last = pos
        self._marks.append((pos, upto))
        if self._busy_since is None:
            self._busy_since = time.monotonic()

    # ---- what the database side reports --------------------------------------------------------------------
    def _mark_applied(self, last: Position, n_ops: int) -> None:
        """A batch through ``last`` is in the database: advance what ``flush`` waits for (caller holds the lock)."""
        self._applied = last
        while self._marks and self._marks[0][0] <= last:
            self._applied_n = self._marks.popleft()[1]
        self.batches += 1
        self.applied_ops += n_ops
        self._busy_since = None if self._last is None or last >= self._last else time.monotonic()
        self._applied_cv.notify_all()

    # ---- health -------------------------------------------------------------------------------------------
    def pending_ops(self) -> int:
        """Operations journaled (or being journaled) and not yet in the database, a previous process's included."""
        with self._lock:
            return max(0, self._backlog - self.applied_ops) + self._submitted - self._applied_n

    def _stalled_since(self) -> float | None:
        """When the database side last made progress, if work has waited on it for ``stall_s`` since."""
        since = self._busy_since
        return since if since is not None and time.monotonic() - since >= self.stall_s else None

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

    def _signal_closing(self) -> None:
        """Refuse new writes and wake every waiter (caller then stops its threads)."""
        with self._lock:
            self._closing = True
            self._incoming_cv.notify_all()
            self._applied_cv.notify_all()

    def _join_threads(self, timeout: float | None) -> None:
        for t in self._threads:
            t.join(timeout=max(timeout or 0, 5.0))
