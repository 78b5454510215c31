"""The journal's files: the on-disk format that ``Journal`` (appends) and ``JournalTail`` (reads) share.

Format (v1): a directory with segment files ``%016d.log``, a ``CHECKPOINT`` file and a ``LOCK`` file. A segment
is a sequence of records ``[u32 LE payload length][u32 LE crc32(payload)][payload]``; payloads are non-empty, so an
all-zero header can only be a zero-filled torn tail. A record's ``Position`` is (segment, byte offset of its end).
``CHECKPOINT`` is JSON ``{"format": 1, "segment": S, "offset": O}``: every record at or before it is in the
database. ``LOCK`` holds the owner's pid under an exclusive ``flock``. The records hold prompts: every file is
created owner-only (0600) and every folder 0700 (:func:`private_dir`, :func:`write_private`), whatever the umask.

Damage is never repaired silently: only a torn record at the very end of the last segment (a crash during a write
that was never acknowledged) is cut off, when the owner opens the journal (:func:`repair_torn_tail`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

HEADER = struct.Struct("<II")
MAX_PAYLOAD = 0xFFFFFFFF
CHECKPOINT_FORMAT = 1


class JournalError(Exception):
    """Base class of journal errors."""


class JournalCorrupt(JournalError):
    """A damaged record that is not a torn tail of the last segment; it is never repaired automatically."""


class JournalLocked(JournalError):
    """Another process (or another Journal object) owns this journal directory."""


@dataclass(frozen=True, order=True)
class Position:
    """Where a record ends: ordered by (segment, offset)."""

    segment: int
    offset: int


class FrameDamage(Exception):
    """A record that cannot be read at ``offset``; ``torn``: it is what a write cut short at the end looks like."""

    def __init__(self, offset: int, reason: str, torn: bool):
        super().__init__(reason)
        self.offset, self.reason, self.torn = offset, reason, torn


def private_dir(path: Path) -> Path:
    """``path`` and the parents it lacks, each created 0700. A parent that exists keeps its mode; ``path`` itself,
    when it exists and is ours, loses group and other access (a journal folder an older OpenForge made)."""
    path = Path(path)
    missing = []
    while not path.is_dir() and path.parent != path:
        missing.append(path)
        path = path.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass
    path = missing[0] if missing else path
    st = os.stat(path)
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.chmod(path, st.st_mode & 0o700)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new owner-only file (its folder made 0700 if missing): a dead letter, say."""
    private_dir(Path(path).parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def frame_payloads(payloads: list[bytes]) -> list[bytes]:
    """Each payload as a record: header + payload."""
    frames = []
    for p in payloads:
        n = len(p)
        if not 0 < n <= MAX_PAYLOAD:
            raise ValueError(f"payload of {n} bytes: a journal record holds 1 to {MAX_PAYLOAD} bytes; "
                             f"encode empty values as at least one byte and split larger ones")
        frames.append(HEADER.pack(n, zlib.crc32(p)) + bytes(p))
    return frames


def read_frames(f, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """Yield (end offset, payload) of records in [start, end); raise FrameDamage (torn: a write cut short at end)."""
    f.seek(start)
    off = start
    while off < end:
        head = f.read(min(HEADER.size, end - off))
        if len(head) < HEADER.size:
            raise FrameDamage(off, f"incomplete header ({len(head)} of {HEADER.size} bytes)", torn=True)
        n, crc = HEADER.unpack(head)
        if n == 0:
            rest = f.read(end - off - HEADER.size)
            zeros = head == bytes(HEADER.size) and rest.count(0) == len(rest)
            raise FrameDamage(off, "zero-length record", torn=zeros)
        if off + HEADER.size + n > end:
            raise FrameDamage(off, f"record of {n} bytes runs past the end of the file at byte {end}", torn=True)
        payload = f.read(n)
        off += HEADER.size + n
        if zlib.crc32(payload) != crc:
            raise FrameDamage(off - HEADER.size - n, "CRC mismatch", torn=off == end)
        yield off, payload


def corrupt(path: Path, damage: FrameDamage) -> JournalCorrupt:
    return JournalCorrupt(
        f"{path}: damaged journal record at byte {damage.offset} ({damage.reason}). Only a torn record at the very end "
        f"of the last segment is repaired automatically, and this is not one. Inspect the file, then move this "
        f"segment aside to reopen the journal (its records from byte {damage.offset} on will not be replayed)."
    )


def segment_path(directory: Path, seg: int) -> Path:
    return directory / f"{seg:016d}.log"


def segment_numbers(directory: Path) -> list[int]:
    """The folder's segments, in order; none if it cannot be listed (as ``Path.glob`` says).

    The drain process asks before every read of the journal it tails. ``Path.glob`` makes a ``Path`` per entry:
    18-21 us on a journal folder of six entries, against 11-12 us for ``os.listdir``; on the loaded 2-core machine
    300 against 40 us, and the glob was 28% of the drain's Python samples at one client in
    ``bench/proxy_overhead.py``'s load (py-spy)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(int(name[:-4]) for name in names if name.endswith(".log") and name[:-4].isdigit())


def load_checkpoint(directory: Path) -> Position | None:
    path = directory / "CHECKPOINT"
    try:
        data = json.loads(path.read_text())
        if data["format"] != CHECKPOINT_FORMAT:
            raise ValueError(f"format {data['format']} is not {CHECKPOINT_FORMAT}")
        return Position(int(data["segment"]), int(data["offset"]))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise JournalCorrupt(
            f"{path}: unreadable checkpoint ({e}); it must be JSON with format {CHECKPOINT_FORMAT}, segment and "
            f"offset. Restore it, or delete it to replay every remaining record."
        ) from None


def write_checkpoint(directory: Path, pos: Position, *, fsync: bool) -> int:
    """Atomically save ``pos`` as the journal's checkpoint (a temporary file per process, then a rename); returns
    how many fsyncs that took."""
    path, tmp = directory / "CHECKPOINT", directory / f"CHECKPOINT.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump({"format": CHECKPOINT_FORMAT, "segment": pos.segment, "offset": pos.offset}, f)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if not fsync:
        return 0
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return 2


def delete_committed(directory: Path, pos: Position, active: int) -> None:
    """Delete the segments wholly at or before ``pos``, never ``active`` (the one being appended to) or later."""
    for seg in segment_numbers(directory):
        if seg >= active or seg > pos.segment:
            break
        seg_path = segment_path(directory, seg)
        if seg < pos.segment or os.path.getsize(seg_path) <= pos.offset:
            seg_path.unlink()


def lock_directory(directory: Path) -> int:
    """Take the journal's ``LOCK`` (one owner at a time) and write our pid into it; returns the descriptor that
    holds the lock until it is closed."""
    fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise JournalLocked(
            f"journal {directory} is locked by another owner (pid {holder}); only one process may own a "
            f"journal directory at a time. Close the other owner or use another directory."
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def repair_torn_tail(directory: Path, *, fsync: bool) -> int:
    """Validate every segment and cut a torn record off the end of the last one; JournalCorrupt for any other
    damage. Returns how many fsyncs that took. Only the journal's owner (who holds its lock) may call this."""
    fsyncs = 0
    segs = segment_numbers(directory)
    for i, seg in enumerate(segs):
        path = segment_path(directory, seg)
        with open(path, "rb", buffering=1 << 20) as f:
            size = os.fstat(f.fileno()).st_size
            try:
                for _ in read_frames(f, 0, size):
                    pass
            except FrameDamage as d:
                if i < len(segs) - 1 or not d.torn:
                    raise corrupt(path, d) from None
                log.warning("%s: dropping %d bytes of a torn record at byte %d (%s), left by a crash during "
                            "a write that was never acknowledged", path, size - d.offset, d.offset, d.reason)
                with open(path, "r+b") as w:
                    w.truncate(d.offset)
                    if fsync:
                        os.fsync(w.fileno())
                        fsyncs += 1
    return fsyncs
