"""``ProcessWriter``: journal here, apply in a child process (``python -m forge_store._write.drain_process``).

For the proxy: its event loop only journals (a kernel write), and the SQL that turns journal entries into rows
runs in another process, so it neither takes the GIL from the loop nor its CPU. The child tails the journal files
from the checkpoint, applies batches (``db_apply.BatchApplier``: the same transactions, retries and dead letters
as ``ThreadWriter``'s thread), saves the checkpoint and reports each applied position on its stdout; ``flush``
waits for those reports. A child that dies is restarted (it resumes from the checkpoint; applying is idempotent);
a parent that dies closes the child's stdin, and the child stops after its current batch. Durability is unchanged:
a write is acknowledged once it is in the journal.

The database URL reaches the child as the first bytes on its stdin (``drain_process.url_handshake``), never in
its command line (which every user can read) or its environment (``child_environment`` leaves ``OPENFORGE_*``
settings out: the store URL, the upstream API key and the admin token stay in this process).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from .._backoff import Backoff
from .journal import Journal
from .journal_files import Position
from .journaling_writer import JournalingWriter

log = logging.getLogger(__name__)

# The folder that holds ``forge_store/`` (this file is forge_store/_write/process_writer.py): the child imports the
# same code as this process, wherever it was started from.
_CODE_ROOT = str(Path(__file__).resolve().parents[2])


def child_environment() -> dict[str, str]:
    """The drain's environment: this one without OpenForge's settings (``OPENFORGE_*`` holds the store URL with its
    password, the upstream API key, the admin token; the child needs none of them: its arguments and stdin say
    everything), with this code on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENFORGE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_CODE_ROOT, os.environ.get("PYTHONPATH")) if p)
    return env


class ProcessWriter(JournalingWriter):
    def __init__(self, journal: Journal, *, url: str, batch_size: int = 512, linger_s: float = 0.05,
                 retry_max_s: float = 5.0, dead_letter_dir: Path | None = None, stall_s: float = 10.0,
                 auto_upgrade: bool = True):
        super().__init__(journal, batch_size=batch_size, linger_s=linger_s, retry_max_s=retry_max_s,
                         dead_letter_dir=dead_letter_dir, stall_s=stall_s)
        self._url, self._auto_upgrade = url, auto_upgrade
        self._proc: subprocess.Popen | None = None
        self._pipe_lock = threading.Lock()
        self._db_down_at: float | None = None
        self._dead = self._dead_base = 0  # dead letters: all children / before the current child started
        self.restarts = 0
        self._start(threading.Thread(target=self._supervise, name="forge-store-drain", daemon=True))

    @property
    def db_down_since(self) -> float | None:
        """Reported by the child (refused connections), or seen here: an apply that has not returned for
        ``stall_s`` while work waits (a stalled database, which the child cannot report from inside the apply)."""
        return self._db_down_at or self._stalled_since()

    @property
    def dead_letters(self) -> int:
        return self._dead

    # ---- the child ---------------------------------------------------------------------------------------
    def _spawn(self) -> subprocess.Popen:
        # Imported here: the child runs drain_process as __main__ after importing this package, which must not have
        # imported drain_process already (it would run twice, and runpy warns).
        from . import drain_process

        argv = [sys.executable, "-m", drain_process.__name__, "--journal", str(self.journal.directory),
                "--batch-size", str(self.batch_size), "--linger", str(self.linger_s),
                "--retry-max", str(self.retry_max_s), "--dead-letter", str(self.dead_letter_dir)]
        if self.journal.fsync:
            argv.append("--fsync")
        if not self._auto_upgrade:
            argv.append("--no-auto-upgrade")
        # its own session: a Ctrl-C at the terminal reaches the proxy, which then drains and stops the child
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_environment(),
                                start_new_session=True)
        try:  # before any command: nothing else can write to this pipe until the supervisor publishes ``proc``
            proc.stdin.write(drain_process.url_handshake(self._url))
            proc.stdin.flush()
        except OSError:  # the child is already gone: the supervisor sees it exit and starts another
            pass
        return proc

    def _supervise(self) -> None:
        delays = Backoff(0.5, 10.0)
        while True:
            with self._lock:
                if self._closing:
                    return
                self._proc = proc = self._spawn()
            for line in proc.stdout:
                self._report(line.split())
                delays.reset()  # it made progress: a later exit is a new failure, restarted soon
            rc = proc.wait()
            with self._lock:
                if self._closing:
                    return
            delay = delays.next()
            log.warning("the store's drain process exited with status %s; restarting it in %.1fs (journaled writes "
                        "wait for it, nothing is lost)", rc, delay)
            self.restarts += 1
            time.sleep(delay)

    def _report(self, words: list[bytes]) -> None:
        """One line of the child's stdout (the protocol is ``drain_process``'s docstring)."""
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

    # ---- control ------------------------------------------------------------------------------------------
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
        self._join_threads(timeout)
        return drained
