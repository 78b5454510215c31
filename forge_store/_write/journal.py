"""``Journal``: the local append-only journal a store's writer owns, the durability layer of DESIGN invariant 1.

A write is journaled before it is acknowledged; the writer's database side later copies journal records into the
database and saves a checkpoint (``mark_committed``); after a crash, the owner that opens the journal next cuts a
torn tail off (the only repair it makes) and replays ``pending()``. The file format is ``journal_files``'s.

Group commit: appenders hand framed records to one flusher thread, which writes everything queued in one write
and one fsync, then releases all of them. After a batch of more than one record it lingers up to
`group_commit_s` for the next batch to fill to the same size, so a single appender never waits on the linger.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .journal_files import (
    HEADER,
    MAX_PAYLOAD,
    FrameDamage,
    JournalError,
    Position,
    corrupt,
    delete_committed,
    frame_payloads,
    load_checkpoint,
    lock_directory,
    private_dir,
    read_frames,
    repair_torn_tail,
    segment_numbers,
    segment_path,
    write_checkpoint,
)


@dataclass(eq=False, slots=True)
class _Request:
    frames: list[bytes]
    callback: Callable[[_Request], None] | None
    pos: Position | None = None
    error: BaseException | None = None


class Journal:
    """Crash-safe append-only journal owned by one process. Thread-safe; a context manager.

    `append*` return only once the record is written and (with `fsync=True`) fsynced; an append that raised may
    still be replayed (writes downstream are idempotent by id). `fsync_count` counts every fsync issued here.
    """

    def __init__(self, directory: str | os.PathLike, *, segment_bytes: int = 64 << 20, fsync: bool = True,
                 group_commit_s: float = 0.002):
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes={segment_bytes}: a segment needs at least 1 byte; pass e.g. 64 << 20")
        if group_commit_s < 0:
            raise ValueError(f"group_commit_s={group_commit_s}: the linger cannot be negative; pass 0 to disable it")
        self.directory = Path(directory)
        self.segment_bytes, self._sync, self._linger = segment_bytes, fsync, group_commit_s
        self.fsync_count = 0
        self._lock, self._ckpt_lock, self._io_lock = threading.Lock(), threading.Lock(), threading.Lock()
        self._work, self._done = threading.Condition(self._lock), threading.Condition(self._lock)  # flusher, appenders
        self._queue: list[_Request] = []
        self._closing, self._failed, self._fd = False, None, -1
        private_dir(self.directory)
        self._lock_fd = lock_directory(self.directory)
        try:
            self._committed = load_checkpoint(self.directory)
            self._recover()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._flusher = threading.Thread(target=self._run, name=f"journal-flusher:{self.directory}", daemon=True)
        self._flusher.start()

    def append(self, payload: bytes) -> Position:
        """Append one record; return its position once it is durable."""
        return self._wait(self._submit([payload], None))

    def append_many(self, payloads: list[bytes]) -> Position:
        """Append records in order with one durable write; return the position of the last."""
        if not payloads:
            raise ValueError("append_many([]): there is nothing to append; pass at least one payload")
        return self._wait(self._submit(payloads, None))

    @property
    def fsync(self) -> bool:
        return self._sync

    def write_now(self, payloads: list[bytes]) -> Position:
        """Append in the calling thread, bypassing the flusher: for a caller that batches by itself (the store's
        writer) and wants no thread hop. Same framing, ordering and durability as ``append_many``."""
        if len(payloads) == 1 and not self._sync:
            return self._write_one(payloads[0])
        with self._io_lock:
            return self._write_held(payloads)

    async def append_async(self, payload: bytes) -> Position:
        """Like `append`, without blocking the event loop. Cancelling the await does not withdraw the record."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def resolve(req: _Request) -> None:
            if fut.cancelled():
                return
            if req.error is None:
                fut.set_result(req.pos)
            else:
                fut.set_exception(self._failure(req.error))

        def notify(req: _Request) -> None:  # on the flusher thread
            with contextlib.suppress(RuntimeError):  # the loop is closed, so no one awaits this record
                loop.call_soon_threadsafe(resolve, req)

        self._submit([payload], notify)
        return await fut

    def replay(self, after: Position | None = None) -> Iterator[tuple[Position, bytes]]:
        """Yield every record durable at the first `next()` and strictly after `after`, in append order."""
        with self._lock:
            self._check_open()
            end = self._durable
        for seg in self._segments():
            if seg > end.segment:
                break
            if after is not None and seg < after.segment:
                continue
            path = self._path(seg)
            try:
                f = open(path, "rb", buffering=1 << 20)
            except FileNotFoundError:
                raise JournalError(
                    f"{path} vanished during replay(after={after}): mark_committed deleted it. Replay from at or "
                    f"after the checkpoint ({self._committed}), or finish replaying before marking records committed."
                ) from None
            with f:
                stop = end.offset if seg == end.segment else os.fstat(f.fileno()).st_size
                start = after.offset if after is not None and seg == after.segment else 0
                try:
                    for off, payload in read_frames(f, min(start, stop), stop):
                        yield Position(seg, off), payload
                except FrameDamage as d:
                    raise corrupt(path, d) from None

    def pending(self) -> Iterator[tuple[Position, bytes]]:
        """Records after the checkpoint: what the database may not have yet."""
        return self.replay(self.committed())

    def committed(self) -> Position | None:
        """The checkpoint last saved by `mark_committed`, or None if never."""
        return self._committed

    def mark_committed(self, pos: Position) -> None:
        """Persist `pos` as the checkpoint (an older one is ignored); delete non-active segments wholly <= it."""
        with self._ckpt_lock:
            with self._lock:
                self._check_open()
                durable, active = self._durable, self._active
            if pos > durable:
                raise JournalError(
                    f"mark_committed({pos}): that is past the durable end of the journal ({durable}); "
                    f"commit only positions returned by append."
                )
            if self._committed is not None and pos <= self._committed:
                return
            fsyncs = write_checkpoint(self.directory, pos, fsync=self._sync)
            with self._lock:
                self.fsync_count += fsyncs
            self._committed = pos
            delete_committed(self.directory, pos, active)

    def close(self) -> None:
        """Finish queued appends, stop the flusher, release the lock. Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._work.notify()
        self._flusher.join()
        if self._fd >= 0:
            os.close(self._fd)
        os.close(self._lock_fd)  # releases the flock

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _path(self, seg: int) -> Path:
        return segment_path(self.directory, seg)

    def _segments(self) -> list[int]:
        return segment_numbers(self.directory)

    def _fsync(self, fd: int) -> None:
        if self._sync:
            os.fsync(fd)
            with self._lock:
                self.fsync_count += 1

    def _fsync_dir(self) -> None:
        if self._sync:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                self._fsync(fd)
            finally:
                os.close(fd)

    def _check_open(self) -> None:
        if self._closing:
            raise JournalError(f"journal {self.directory} is closed; open a new Journal on it to continue")

    def _recover(self) -> None:
        """Cut a torn tail off the last segment (any other damage raises) and open the active segment."""
        self.fsync_count += repair_torn_tail(self.directory, fsync=self._sync)
        segs = self._segments()
        if segs:
            self._active = segs[-1]
            self._fd = os.open(self._path(self._active), os.O_WRONLY | os.O_APPEND)
            self._size = os.fstat(self._fd).st_size
        else:
            self._open_segment(self._committed.segment + 1 if self._committed else 0)
        self._durable = Position(self._active, self._size)

    def _open_segment(self, seg: int) -> None:
        self._fd = os.open(self._path(seg), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        self._fsync_dir()
        with self._lock:
            self._active, self._size = seg, 0

    def _submit(self, payloads: list[bytes], callback: Callable[[_Request], None] | None) -> _Request:
        req = _Request(frame_payloads(payloads), callback)
        with self._lock:
            self._check_open()
            if self._failed is not None:
                raise self._failure(self._failed)
            self._queue.append(req)
            self._work.notify()
        return req

    def _wait(self, req: _Request) -> Position:
        with self._lock:
            while req.pos is None and req.error is None:
                self._done.wait()
        if req.error is not None:
            raise self._failure(req.error)
        return req.pos

    def _failure(self, err: BaseException) -> JournalError:
        e = JournalError(
            f"journal {self.directory}: a write or fsync failed ({err!r}); the record may not be durable and the "
            f"journal refuses further appends, since a failed fsync cannot be retried safely. Close it and reopen it."
        )
        e.__cause__ = err
        return e

    def _run(self) -> None:
        last_batch = 1
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._work.wait()
                if not self._queue:
                    return
                if last_batch > 1 and self._linger > 0:
                    deadline = time.monotonic() + self._linger
                    while len(self._queue) < last_batch and not self._closing:
                        left = deadline - time.monotonic()
                        if left <= 0 or not self._work.wait(left):
                            break
                batch, self._queue = self._queue, []
                failed = self._failed
            if failed is None:
                try:
                    with self._io_lock:
                        self._write(batch)
                except BaseException as e:  # noqa: BLE001 - every waiter must learn of it, then the journal stops
                    failed = e
            with self._lock:
                if failed is not None:
                    self._failed = failed
                    for req in batch:
                        req.error = failed
                self._done.notify_all()
            for req in batch:
                if req.callback is not None:
                    req.callback(req)
            last_batch = len(batch)

    def _write_one(self, payload: bytes) -> Position:
        """``write_now`` of one record without fsync, in as few steps as the proxy's loop can spend between an
        answer's arrival and its last byte: header and payload in one ``writev``, no frame copies."""
        n = len(payload)
        if not 0 < n <= MAX_PAYLOAD:
            frame_payloads([payload])  # raises, saying why
        head = HEADER.pack(n, zlib.crc32(payload))
        with self._io_lock:
            size = self._size + len(head) + n
            if self._closing or self._failed is not None or (self._size and size > self.segment_bytes):
                return self._write_held([payload])
            try:
                done = os.writev(self._fd, (head, payload))
                if done < len(head) + n:  # a short write (a full disk): the rest, or the error that stops it
                    data = memoryview(head + payload)[done:]
                    while data:
                        data = data[os.write(self._fd, data):]
            except BaseException as e:
                with self._lock:
                    self._failed = e
                raise self._failure(e) from e
            pos = Position(self._active, size)
            with self._lock:
                self._size, self._durable = size, pos
            return pos

    def _write_held(self, payloads: list[bytes]) -> Position:
        """``write_now``'s general path (also ``_write_one``'s for a closed or failed journal and for a segment to
        rotate); the caller holds the I/O lock."""
        req = _Request(frame_payloads(payloads), None)
        with self._lock:
            self._check_open()
            if self._failed is not None:
                raise self._failure(self._failed)
        try:
            self._write([req])
        except BaseException as e:
            with self._lock:
                self._failed = e
            raise self._failure(e) from e
        return req.pos

    def _write(self, batch: list[_Request]) -> None:
        """Write and fsync a batch, rotating segments as needed; set each request's position."""
        chunks: list[bytes] = []
        ends: list[tuple[_Request, int, int]] = []
        size = self._size
        for req in batch:
            for frame in req.frames:
                if size > 0 and size + len(frame) > self.segment_bytes:
                    self._write_out(chunks, size)
                    os.close(self._fd)
                    self._fd = -1
                    self._open_segment(self._active + 1)
                    chunks, size = [], 0
                chunks.append(frame)
                size += len(frame)
            ends.append((req, self._active, size))
        self._write_out(chunks, size)
        with self._lock:
            for req, seg, off in ends:
                req.pos = Position(seg, off)

    def _write_out(self, chunks: list[bytes], size: int) -> None:
        if not chunks:
            return
        data = memoryview(b"".join(chunks))
        while data:
            data = data[os.write(self._fd, data):]
        self._fsync(self._fd)
        with self._lock:
            self._size = size
            self._durable = Position(self._active, size)
