"""``RolloutLedger``: the proxy's own durable record of the rollouts it registered and ended.

A rollout token is signed (``_auth``), so checking one needs no database; whether its rollout is still open does.
The ledger answers that from local disk, so a restarted proxy serves a live rollout's token and refuses an ended
one's while the database is away (or behind: a registration still in the journal is not in the database yet), and
an end is durable before the admin API answers it.

Format v1: a text file (owner-only) whose first line is ``openforge-rollout-ledger 1``, then one JSON array per
line, ``["S", rollout_id]`` (registered) or ``["E", rollout_id]`` (ended), each appended in one ``write`` (so it
survives kill -9 of the proxy) and fsynced when the proxy's journal is (``proxy_journal_fsync``: power loss). A
torn last line, cut by a crash during its write, was never acknowledged and is skipped. The file grows by about
60 bytes a rollout and is read once, at start.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson

log = logging.getLogger("proxy")

HEADER = b"openforge-rollout-ledger 1\n"


class LedgerError(Exception):
    """The ledger cannot be read (a damaged line other than the last, another format)."""


class RolloutLedger:
    def __init__(self, path: Path, *, fsync: bool):
        self.path, self._fsync = Path(path), fsync
        self.started: set[str] = set()
        self.ended: set[str] = set()
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            self._load()
        except BaseException:
            os.close(self._fd)
            raise

    def _load(self) -> None:
        with open(self._fd, "rb", closefd=False) as f:
            data = f.read()
        if not data:
            self._append(HEADER)
            return
        if not data.startswith(HEADER):
            first = data.split(b"\n", 1)[0][:60]
            raise LedgerError(f"{self.path} is not a rollout ledger of format 1 (its first line is {first!r}); "
                              "move it aside to start an empty one (which forgets which rollouts ended)")
        lines = data[len(HEADER):].split(b"\n")
        for i, line in enumerate(lines):
            if not line:
                continue
            try:
                kind, rollout_id = orjson.loads(line)
            except (orjson.JSONDecodeError, ValueError, TypeError):
                if i == len(lines) - 1:  # no newline after it: a write cut short by a crash, never acknowledged
                    log.warning("%s: skipping a torn last record (%d bytes)", self.path, len(line))
                    os.ftruncate(self._fd, len(data) - len(line))
                    return
                raise LedgerError(f"{self.path}: line {i + 2} is damaged ({line[:60]!r}); it is not the last, so "
                                  "it is not a crash's torn write. Inspect the file; moving it aside forgets which "
                                  "rollouts ended") from None
            (self.ended if kind == "E" else self.started).add(rollout_id)

    def _append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        if self._fsync:
            os.fsync(self._fd)

    def start(self, rollout_id: str) -> None:
        """Record a registration (once)."""
        if rollout_id not in self.started:
            self._append(orjson.dumps(["S", rollout_id]) + b"\n")
            self.started.add(rollout_id)

    def end(self, rollout_id: str) -> None:
        """Record an end (once); durable when this returns."""
        if rollout_id not in self.ended:
            self._append(orjson.dumps(["E", rollout_id]) + b"\n")
            self.ended.add(rollout_id)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
