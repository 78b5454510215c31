"""The local journal against real files: rotation, checkpoints, crash recovery, locking, group commit, SIGKILL."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from forge_store._write.journal import Journal
from forge_store._write.journal_files import JournalCorrupt, JournalError, JournalLocked, Position


def records(j: Journal, after: Position | None = None) -> list[bytes]:
    return [p for _, p in j.replay(after)]


def segments(d: Path) -> list[Path]:
    return sorted(d.glob("*.log"))


def test_round_trip_across_rotations(tmp_path):
    payloads = [bytes([i % 251]) * (1 + i % 97) for i in range(300)]
    with Journal(tmp_path, segment_bytes=512, fsync=False) as j:
        positions = [j.append(p) for p in payloads[:100]]
        positions.append(j.append_many(payloads[100:200]))
        positions += [j.append(p) for p in payloads[200:]]
        big = j.append(b"x" * 2000)  # larger than a segment: gets its own
        after_big = j.append(b"after")
        replayed = list(j.replay())
        assert j.fsync_count == 0
    assert [p for _, p in replayed] == payloads + [b"x" * 2000, b"after"]
    assert [pos for pos, _ in replayed] == sorted(pos for pos, _ in replayed)
    assert positions[:100] == [pos for pos, _ in replayed[:100]]
    assert positions[100] == replayed[199][0]
    assert big.offset == 2008 and after_big.segment == big.segment + 1
    assert len(segments(tmp_path)) > 10
    assert all(f.stat().st_size <= 512 for f in segments(tmp_path) if f.name != f"{big.segment:016d}.log")


def test_write_now_one_record_at_a_time_across_rotations(tmp_path):
    """``write_now`` of single records without fsync (the proxy's path: one writev per record, no flusher) keeps the
    same framing, order and rotation as ``append``; a closed journal refuses, an empty payload says why."""
    payloads = [bytes([i % 251]) * (1 + i % 97) for i in range(200)] + [b"x" * 2000, b"after"]
    with Journal(tmp_path, segment_bytes=512, fsync=False) as j:
        positions = [j.write_now([p]) for p in payloads]
        with pytest.raises(ValueError, match="1 to"):
            j.write_now([b""])
        assert list(j.replay()) == list(zip(positions, payloads))
    assert positions == sorted(positions) and len(segments(tmp_path)) > 10
    assert all(f.stat().st_size <= 512 for f in segments(tmp_path) if f.name != f"{positions[-2].segment:016d}.log")
    with pytest.raises(JournalError, match="closed"):
        j.write_now([b"late"])
    with Journal(tmp_path, segment_bytes=512, fsync=False) as j:  # reopened: every record, then more after them
        assert records(j) == payloads
        j.write_now([b"next"])
        assert records(j) == payloads + [b"next"]


def test_replay_after_and_mark_committed(tmp_path):
    payloads = [f"record {i}".encode() * 3 for i in range(100)]
    with Journal(tmp_path, segment_bytes=300) as j:
        positions = [j.append(p) for p in payloads]
        assert j.committed() is None and records(j) == payloads
        cut = positions[49]
        assert records(j, after=cut) == payloads[50:]
        j.mark_committed(cut)
        assert j.committed() == cut
        assert records(j) == [p for pos, p in zip(positions, payloads) if pos.segment >= cut.segment]
        assert [p for _, p in j.pending()] == payloads[50:]
        assert min(int(f.stem) for f in segments(tmp_path)) == cut.segment
        j.mark_committed(positions[10])  # older: ignored
        assert j.committed() == cut
        with pytest.raises(JournalError, match="past the durable end"):
            j.mark_committed(Position(positions[-1].segment + 1, 0))
    with Journal(tmp_path, segment_bytes=300) as j:
        assert j.committed() == cut
        assert [p for _, p in j.pending()] == payloads[50:]
        j.mark_committed(positions[-1])
        assert list(j.pending()) == []
        assert [int(f.stem) for f in segments(tmp_path)] == [positions[-1].segment]  # the active one stays
        pos = j.append(b"next")
    with Journal(tmp_path, segment_bytes=300) as j:
        assert list(j.pending()) == [(pos, b"next")]


def test_reopen_continues_in_order(tmp_path):
    with Journal(tmp_path, segment_bytes=100) as j:
        first = [j.append(f"a{i}".encode()) for i in range(20)]
    j = Journal(tmp_path, segment_bytes=100)
    second = [j.append(f"b{i}".encode()) for i in range(20)]
    assert first[-1] < second[0]
    assert records(j) == [f"a{i}".encode() for i in range(20)] + [f"b{i}".encode() for i in range(20)]
    j.close()
    j.close()  # idempotent
    with pytest.raises(JournalError, match="closed"):
        j.append(b"late")


def _ten(tmp_path) -> Path:
    with Journal(tmp_path) as j:
        for i in range(10):
            j.append(f"record-{i}".encode())
    (last,) = segments(tmp_path)
    return last


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[:-3], id="truncated-payload"),
        pytest.param(lambda b: b[:-15], id="truncated-header"),
        pytest.param(lambda b: b[:-1] + bytes([b[-1] ^ 1]), id="crc-of-last-record"),
        pytest.param(lambda b: b[:-16] + bytes(16), id="zero-filled"),
    ],
)
def test_torn_tail_is_cut_off(tmp_path, caplog, damage):
    seg = _ten(tmp_path)
    seg.write_bytes(damage(seg.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="forge_store._write.journal_files"), Journal(tmp_path) as j:
        assert records(j) == [f"record-{i}".encode() for i in range(9)]
        assert "dropping" in caplog.text and seg.name in caplog.text
        pos = j.append(b"after")
    with Journal(tmp_path) as j:
        assert list(j.replay())[-1] == (pos, b"after")


def test_partial_header_garbage_keeps_every_record(tmp_path, caplog):
    seg = _ten(tmp_path)
    size = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"\x05\x00")
    with caplog.at_level(logging.WARNING, logger="forge_store._write.journal_files"), Journal(tmp_path) as j:
        assert records(j) == [f"record-{i}".encode() for i in range(10)]
        assert "dropping 2 bytes" in caplog.text
    assert seg.stat().st_size == size


def test_crc_flip_mid_file_is_corrupt(tmp_path):
    seg = _ten(tmp_path)
    data = bytearray(seg.read_bytes())
    data[8 + 3] ^= 0xFF  # payload of the first record
    seg.write_bytes(data)
    with pytest.raises(JournalCorrupt, match=rf"{seg.name}.*byte 0 \(CRC mismatch\).*move this segment aside"):
        Journal(tmp_path)
    with pytest.raises(JournalCorrupt):  # not JournalLocked: the failed open released its lock
        Journal(tmp_path)


def test_torn_non_last_segment_is_corrupt(tmp_path):
    with Journal(tmp_path, segment_bytes=64, fsync=False) as j:
        for i in range(20):
            j.append(b"%d" % i * 10)
    first = segments(tmp_path)[0]
    first.write_bytes(first.read_bytes()[:-2])
    with pytest.raises(JournalCorrupt, match=first.name):
        Journal(tmp_path)


def test_empty_payload_rejected(tmp_path):
    with Journal(tmp_path) as j:
        with pytest.raises(ValueError, match="1 to"):
            j.append(b"")
        with pytest.raises(ValueError, match="nothing to append"):
            j.append_many([])


_TRY_OPEN = textwrap.dedent(
    """
    import sys
    from forge_store._write.journal import Journal
    from forge_store._write.journal_files import JournalLocked
    try:
        Journal(sys.argv[1]).close()
    except JournalLocked as e:
        print("LOCKED", e)
    else:
        print("OPENED")
    """
)


def test_second_process_is_locked_out(tmp_path):
    def try_open() -> str:
        return subprocess.run(
            [sys.executable, "-c", _TRY_OPEN, str(tmp_path)], capture_output=True, text=True, check=True, timeout=30
        ).stdout

    j = Journal(tmp_path)
    out = try_open()
    assert out.startswith("LOCKED") and str(tmp_path) in out and f"pid {os.getpid()}" in out
    assert "another directory" in out
    with pytest.raises(JournalLocked):
        Journal(tmp_path)  # a second object in this process too
    j.close()
    assert try_open().startswith("OPENED")


def test_concurrent_appends_share_fsyncs(tmp_path):
    threads, per_thread = 16, 200
    with Journal(tmp_path, segment_bytes=64 << 10) as j:
        start = threading.Barrier(threads)

        def work(t: int) -> None:
            start.wait()
            for i in range(per_thread):
                j.append(f"{t}:{i}".encode())

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        got = records(j)
        fsyncs = j.fsync_count
    assert sorted(got) == sorted(f"{t}:{i}".encode() for t in range(threads) for i in range(per_thread))
    for t in range(threads):  # each thread's records in its own order
        assert [r for r in got if r.startswith(f"{t}:".encode())] == [f"{t}:{i}".encode() for i in range(per_thread)]
    assert fsyncs < threads * per_thread / 4, fsyncs


def test_append_async(tmp_path):
    async def main(j: Journal) -> list[Position]:
        return await asyncio.gather(*(j.append_async(f"task {i}".encode()) for i in range(200)))

    with Journal(tmp_path) as j:
        positions = asyncio.run(main(j))
        assert len(set(positions)) == 200
        assert dict(j.replay()) == {pos: f"task {i}".encode() for i, pos in enumerate(positions)}
        assert j.fsync_count < 100


_WRITER = textwrap.dedent(
    """
    import sys, threading
    from forge_store._write.journal import Journal
    j = Journal(sys.argv[1], segment_bytes=4096)
    lock = threading.Lock()
    def work(t):
        for i in range(10**9):
            n = t * 10**6 + i
            j.append(str(n).encode())
            with lock:
                sys.stdout.write(f"{n}\\n")
                sys.stdout.flush()
    for t in range(4):
        threading.Thread(target=work, args=(t,)).start()
    """
)


def test_sigkill_loses_no_acknowledged_record(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    acked = []
    try:
        for line in child.stdout:
            acked.append(int(line))
            if len(acked) >= 600:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    acked += [int(line) for line in child.stdout.read().split()]
    child.stdout.close()
    assert child.returncode == -signal.SIGKILL and len(acked) >= 600
    with Journal(tmp_path, segment_bytes=4096) as j:
        got = [int(p) for p in records(j)]
    assert len(got) == len(set(got))
    assert set(acked) <= set(got)
    for t in range(4):  # per thread, a gapless prefix 0..k
        mine = [n - t * 10**6 for n in got if n // 10**6 == t]
        assert mine == list(range(len(mine)))
