"""The store's drain process: applies a journal another process appends to (``process_writer.ProcessWriter``).

Run by that writer, not by hand: ``python -m forge_store._write.drain_process --journal DIR ...``, with the
database URL as the first bytes on stdin (``url_handshake``: kept out of the process list and the environment).
It reads complete records after the journal's checkpoint (``JournalTail``), applies them in batches
(``BatchApplier``), reports ``a SEGMENT OFFSET COUNT`` on stdout after each commit (``d 1`` / ``d 0`` when the
database goes away / comes back, ``x N`` for dead letters, ``s`` once started) and saves the checkpoint about once
a second. Commands on stdin, after the URL: ``f`` apply now, ``q`` apply everything journaled and stop, ``Q`` stop
after the current batch. End of input means the parent died: stop after the current batch without touching the
checkpoint or the segments, which belong to whoever opens the journal next (it replays from the checkpoint;
applying is idempotent). One drain per journal at a time (``DRAIN.lock``). Before its first batch it checks the
schema (``db_ready``; the parent may have started while the database was away) and exits 3 on a schema it cannot
write to (the parent restarts it with back-off; the journal keeps everything). Files it creates are owner-only.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import select
import signal
import sys
import time
from pathlib import Path

from .._engine import create_engine
from .._errors import SchemaMismatch
from .db_apply import BatchApplier
from .db_ready import wait_for_schema
from .journal_tail import JournalTail
from .op_codec import unpack_op


def url_handshake(url: str) -> bytes:
    """What the parent writes first on the child's stdin: the database URL's length in bytes, a newline, the URL."""
    data = url.encode()
    return b"%d\n%s" % (len(data), data)


def read_url_handshake(fd: int) -> str:
    """Read ``url_handshake``'s bytes from ``fd`` and not one byte more (the parent's commands follow them)."""
    head = b""
    while not head.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte or len(head) > 20:
            raise SystemExit("forge_store._write.drain_process: no database URL on stdin; this process is started by "
                             "the store's ProcessWriter, which writes it there first")
        head += byte
    n, data = int(head), b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise SystemExit(f"forge_store._write.drain_process: stdin ended {n - len(data)} bytes into the database "
                             "URL; the store's ProcessWriter that started this process is gone")
        data += chunk
    return data.decode()


class Control:
    """The parent's commands on stdin."""

    def __init__(self, fd: int):
        self.fd, self.stop, self.wake = fd, None, False  # stop: None, "drain" (q), "now" (Q), "orphan" (end of input)

    @property
    def halted(self) -> bool:
        return self.stop in ("now", "orphan")

    def poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` for a command (returns at once on one)."""
        if self.halted:
            return
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0))
        if not ready:
            return
        data = os.read(self.fd, 4096)
        if not data:
            self.stop = "orphan"
            return
        if b"Q" in data:
            self.stop = "now"
        elif b"q" in data:
            self.stop = self.stop or "drain"
        if b"f" in data:
            self.wake = True


def say(line: str) -> None:
    try:
        os.write(1, line.encode() + b"\n")
    except BrokenPipeError:
        pass  # the parent is gone; the stop arrives on stdin


def run(journal: Path, url: str, *, batch_size: int, linger_s: float, retry_max_s: float, dead_letter: Path,
        fsync: bool, checkpoint_every_s: float = 1.0, auto_upgrade: bool = True) -> None:
    lock = os.open(journal / "DRAIN.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a predecessor may still be finishing its batch
    say("s")
    engine = create_engine(url)
    tail, applier, control = JournalTail(journal), BatchApplier(dead_letter, retry_max_s), Control(0)
    applied, saved, saved_at, down, dead = None, None, time.monotonic(), False, 0

    def went_down() -> None:
        nonlocal down
        if not down:
            down = True
            say("d 1")

    def wait(delay: float) -> bool:  # while the database is down
        went_down()
        control.poll(delay)
        return not control.halted

    try:
        # the parent may have started without the database (open_store(offline=True)): the schema comes first
        if not wait_for_schema(engine, auto_upgrade=auto_upgrade, retry_max_s=retry_max_s, wait=wait,
                               down=went_down):
            return
        if down:
            down = False
            say("d 0")
        while not control.halted:
            batch = tail.read(batch_size)
            if not batch:
                if control.stop == "drain":
                    break
                control.wake = False
                control.poll(linger_s)
                continue
            if len(batch) < batch_size and not control.wake and not control.stop:
                control.poll(linger_s)  # let the batch fill: fewer, larger transactions
                batch += tail.read(batch_size - len(batch))
            control.wake = False
            if not applier.apply(engine, [unpack_op(payload) for _, payload in batch], wait):
                break
            applied = batch[-1][0]
            if down and applier.db_down_since is None:
                down = False
                say("d 0")
            if applier.dead_letters != dead:
                dead = applier.dead_letters
                say(f"x {dead}")
            say(f"a {applied.segment} {applied.offset} {len(batch)}")  # last: a flush waiting on it sees the rest
            if time.monotonic() - saved_at >= checkpoint_every_s:
                tail.commit(applied, fsync=fsync)
                saved, saved_at = applied, time.monotonic()
    finally:
        if applied is not None and applied != saved and control.stop != "orphan":
            tail.commit(applied, fsync=fsync)
        engine.dispose()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--journal", required=True, type=Path)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--linger", type=float, default=0.05)
    ap.add_argument("--retry-max", type=float, default=5.0)
    ap.add_argument("--dead-letter", type=Path)
    ap.add_argument("--fsync", action="store_true")
    ap.add_argument("--no-auto-upgrade", action="store_true", help="Do not create the schema in an empty database.")
    args = ap.parse_args(argv)
    os.umask(0o077)  # dead letters and checkpoints hold what the journal holds: owner-only
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    # Draining is background work: the parent answers harnesses, and its latency is what matters. At a lower
    # priority the drain takes the CPU the parent leaves idle; under a load spike it falls behind and the journal
    # holds the difference until it catches up.
    with contextlib.suppress(OSError):
        os.nice(10)
    logging.basicConfig(level=logging.WARNING, format="openforge drain: %(message)s", stream=sys.stderr)
    url = read_url_handshake(0)
    try:
        run(args.journal, url, batch_size=args.batch_size, linger_s=args.linger, retry_max_s=args.retry_max,
            dead_letter=args.dead_letter or args.journal / "dead-letter", fsync=args.fsync,
            auto_upgrade=not args.no_auto_upgrade)
    except SchemaMismatch as exc:  # nothing is applied; the journal keeps every write until the schema is fixed
        logging.getLogger(__name__).error("%s", exc)
        raise SystemExit(3) from None


if __name__ == "__main__":
    main()
