"""``JournalTail``: reads a journal that another process appends to (the drain process reads the proxy's)."""

from __future__ import annotations

import os
from pathlib import Path

from .journal_files import (
    FrameDamage,
    Position,
    corrupt,
    delete_committed,
    load_checkpoint,
    read_frames,
    segment_numbers,
    segment_path,
    write_checkpoint,
)


class JournalTail:
    """A cursor over a journal's records that takes no lock (the appender holds it).

    ``read`` returns the complete records after the cursor and advances it. A record still being written at the end
    of the newest segment is left for the next read; a damaged record anywhere else is ``JournalCorrupt``. A segment
    is finished once a newer one exists (the appender never goes back). ``commit`` saves a checkpoint and deletes
    segments that lie wholly before it (never the newest).
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.cursor: Position | None = load_checkpoint(self.directory)

    def read(self, limit: int) -> list[tuple[Position, bytes]]:
        out: list[tuple[Position, bytes]] = []
        while len(out) < limit:
            segs = [n for n in segment_numbers(self.directory) if self.cursor is None or n >= self.cursor.segment]
            if not segs:
                break
            seg, newest = segs[0], len(segs) == 1
            start = self.cursor.offset if self.cursor is not None and self.cursor.segment == seg else 0
            got = self._read_segment(seg, start, limit - len(out), last=newest)
            out.extend(got)
            if got:
                self.cursor = got[-1][0]
            elif not newest:  # a finished segment, read to its end: on to the next
                self.cursor = Position(segs[1], 0)
            if newest:
                break
        return out

    def _read_segment(self, seg: int, start: int, limit: int, *, last: bool) -> list[tuple[Position, bytes]]:
        path = segment_path(self.directory, seg)
        out = []
        try:
            f = open(path, "rb", buffering=1 << 20)
        except FileNotFoundError:
            return out
        with f:
            end = os.fstat(f.fileno()).st_size
            try:
                for off, payload in read_frames(f, min(start, end), end):
                    out.append((Position(seg, off), payload))
                    if len(out) >= limit:
                        break
            except FrameDamage as d:
                if not (last and d.torn):  # a record half-written right now is not damage; anything else is
                    raise corrupt(path, d) from None
        return out

    def commit(self, pos: Position, *, fsync: bool) -> None:
        write_checkpoint(self.directory, pos, fsync=fsync)
        segs = segment_numbers(self.directory)
        if segs:
            delete_committed(self.directory, pos, segs[-1])
