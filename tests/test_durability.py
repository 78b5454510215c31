"""Invariant 1 on real databases: nothing lost, nothing twice, across SIGKILL, outages and damaged journals."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from forge_store import InvalidRecord, JournalCorrupt, open_store
from forge_store._schema import Call
from tests.conftest import make_call
from tests.netfault import TcpRelay

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import sys
    from forge_store import open_store, Settings
    from tests.conftest import make_call
    url, home, start, n, fsync = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
    st = open_store(url, journal=True, settings=Settings(home=home, writer_batch_size=8, journal_fsync=fsync),
                    drain=sys.argv[6])
    for i in range(start, start + n):
        st.record_call(make_call(f"c{i}", f"r{i % 4}", i // 4))
        print(f"ack c{i}", flush=True)
    print("done", flush=True)
    sys.stdin.read()  # stay alive until killed
    """
)


def _spawn(url, home, start, n, fsync=True, drain="thread"):
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(home), str(start), str(n), "1" if fsync else "0", drain],
        cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _read_acks(proc, until: int | None = None, timeout=60) -> list[str]:
    acks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line or line.strip() == "done":
            break
        acks.append(line.split()[1])
        if until is not None and len(acks) >= until:
            break
    return acks


def _call_ids(url) -> list[str]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        ids = conn.execute(sa.select(Call.id)).scalars().all()
    engine.dispose()
    return ids


def _check_exactly_once(url, settings, acked):
    with open_store(url, journal=True, settings=settings) as st:
        assert st.flush(60)
    ids = _call_ids(url)
    assert len(ids) == len(set(ids)), "a call was stored twice"
    assert set(acked) <= set(ids), f"acknowledged calls lost: {sorted(set(acked) - set(ids))[:5]}"
    with open_store(url, settings=settings) as st:  # deltas resolve after the replay
        for r in range(4):
            for c in st.calls(f"r{r}"):
                i = int(c.id[1:])
                assert c.messages == make_call("x", "r", i // 4).messages
                assert c.prompt_token_ids == make_call("x", "r", i // 4).prompt_token_ids


def test_sigkill_in_the_middle_of_a_postgres_batch(pg_database, settings, tmp_path):
    """The writer's transaction is blocked half-way (a lock on `calls`) when the process dies."""
    with open_store(pg_database, settings=settings):
        pass  # create the schema
    plain = sa.engine.make_url(pg_database).set(drivername="postgresql").render_as_string(hide_password=False)
    locker = psycopg.connect(plain)
    locker.execute("LOCK TABLE calls IN ACCESS EXCLUSIVE MODE")
    proc = _spawn(pg_database, settings.home, 0, 60)
    try:
        acked = _read_acks(proc)
        assert len(acked) == 60  # the journal acknowledges while the database is stuck
        with psycopg.connect(plain, autocommit=True) as watch:
            for _ in range(100):
                waiting = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query ILIKE '%calls%'"
                ).fetchone()[0]
                if waiting:
                    break
                time.sleep(0.05)
        assert waiting, "the writer never reached the calls insert"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
        locker.rollback()
        locker.close()
    time.sleep(0.5)
    assert _call_ids(pg_database) == []  # the half-done batch died with the process
    _check_exactly_once(pg_database, settings, acked)


@pytest.mark.parametrize("fsync,drain", [(True, "thread"), (False, "thread"), (False, "process")],
                         ids=["fsync", "kernel-write", "kernel-write-drain-process"])
def test_repeated_sigkill_at_random_points(store_url, settings, fsync, drain):
    """Without fsync a journaled write is in the kernel: it survives kill -9 of the process all the same. With a
    drain process, the killed writer's child is orphaned mid-batch; the next opener replays behind it."""
    acked, start = [], 0
    for kill_after in (23, 57, 5):
        proc = _spawn(store_url, settings.home, start, 120, fsync, drain)
        try:
            acked += _read_acks(proc, until=kill_after)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            proc.kill()
        start += 120
    _check_exactly_once(store_url, settings, acked)


@pytest.mark.parametrize("drain", ["thread", "process"])
def test_postgres_outage_loses_nothing(pg_database, settings, drain):
    url = sa.engine.make_url(pg_database)
    relay = TcpRelay(url.host or "127.0.0.1", url.port or 5432)
    relayed = url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    settings.writer_retry_max_s = 0.2
    try:
        with open_store(relayed, journal=True, settings=settings, drain=drain) as st:
            for i in range(20):
                st.record_call(make_call(f"c{i}", f"r{i % 4}", i // 4))
            assert st.flush(30)
            relay.cut()
            t0 = time.monotonic()
            for i in range(20, 200):
                st.record_call(make_call(f"c{i}", f"r{i % 4}", i // 4))  # keeps acknowledging
            st.add_reward("r0", 1.0, id="rw")
            assert time.monotonic() - t0 < 30
            assert not st.flush(1.0)  # nothing reaches the database while it is away
            assert len(_call_ids(pg_database)) == 20
            assert st.writer_status()["db_down_s"] is not None
            relay.restore()
            assert st.flush(60)
            assert st.writer_status()["db_down_s"] is None
        _check_exactly_once(pg_database, settings, [f"c{i}" for i in range(200)])
    finally:
        relay.close()


def test_store_outage_longer_than_the_memory_queue(pg_database, settings):
    """A long outage spills to the journal files; draining reads them back in order."""
    url = sa.engine.make_url(pg_database)
    relay = TcpRelay(url.host or "127.0.0.1", url.port or 5432)
    relayed = url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    settings.writer_retry_max_s = 0.2
    try:
        st = open_store(relayed, journal=True, settings=settings)
        st._writer.max_queue = 10
        relay.cut()
        for i in range(150):
            st.record_call(make_call(f"c{i}", f"r{i % 4}", i // 4))
        relay.restore()
        assert st.flush(60)
        st.close()
        _check_exactly_once(pg_database, settings, [f"c{i}" for i in range(150)])
    finally:
        relay.close()


def test_sqlite_locked_by_another_process_drains_afterwards(tmp_path, settings):
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with open_store(url, settings=settings):
        pass
    blocker = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3,sys,time; c=sqlite3.connect(sys.argv[1], isolation_level=None);"
         "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(3); c.execute('COMMIT')",
         str(tmp_path / "store.sqlite")], stdout=subprocess.PIPE, text=True)
    assert blocker.stdout.readline().strip() == "locked"
    with open_store(url, journal=True, settings=settings) as st:
        t0 = time.monotonic()
        for i in range(40):
            st.record_call(make_call(f"c{i}", f"r{i % 4}", i // 4))
        assert time.monotonic() - t0 < 2.5  # acknowledged from the journal while the file is locked
        assert st.flush(60)
    blocker.wait(10)
    _check_exactly_once(url, settings, [f"c{i}" for i in range(40)])


def _journal_with_undrained_calls(url, settings, n=30):
    """Leave ``n`` calls only in the journal: the writer's database is swapped for one that is never there."""
    st = open_store(url, journal=True, settings=settings.model_copy(update={"writer_retry_max_s": 0.1}))
    st._writer.engine = sa.create_engine("postgresql+psycopg://x@127.0.0.1:1/x")
    for i in range(n):
        st.record_call(make_call(f"c{i}", f"r{i % 4}", i // 4))
    st.close(timeout=0.1)
    return sorted(settings.resolved_journal_dir().glob("*.log"))


def test_torn_journal_tail_is_recovered_without_losing_complete_records(store_url, settings, caplog):
    segments = _journal_with_undrained_calls(store_url, settings)
    with open(segments[-1], "ab") as fh:
        fh.write(b"\x40\x00\x00\x00\x12\x34")  # a record header cut short by a crash
    caplog.set_level(logging.WARNING)
    _check_exactly_once(store_url, settings, [f"c{i}" for i in range(30)])
    assert any("torn" in r.getMessage().lower() or "dropped" in r.getMessage().lower() for r in caplog.records)


def test_damaged_journal_middle_is_an_error_not_a_silent_loss(store_url, settings):
    segments = _journal_with_undrained_calls(store_url, settings)
    data = bytearray(segments[-1].read_bytes())
    data[20] ^= 0xFF  # inside the first record's payload
    segments[-1].write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt, match=r"\.log.*byte 0.*move this segment aside"):
        open_store(store_url, journal=True, settings=settings)
    assert _call_ids(store_url) == []


def test_a_killed_drain_process_is_restarted_and_loses_nothing(store_url, settings):
    with open_store(store_url, journal=True, settings=settings, drain="process") as st:
        assert st.writer_status()["drain"] == "process"
        assert not any(t.name == "forge-store-writer" for t in threading.enumerate())
        for i in range(50):
            st.record_call(make_call(f"c{i}", f"r{i % 4}", i // 4))
        assert st.flush(30)
        first = st._writer._proc
        first.kill()
        for i in range(50, 150):  # acknowledged from the journal while no drain process runs
            st.record_call(make_call(f"c{i}", f"r{i % 4}", i // 4))
        assert st.flush(60)
        assert st._writer.restarts >= 1 and st._writer._proc.pid != first.pid
        assert st.writer_status()["pending_ops"] == 0
    _check_exactly_once(store_url, settings, [f"c{i}" for i in range(150)])


@pytest.mark.parametrize("drain", ["thread", "process"])
def test_a_write_the_database_rejects_is_dead_lettered_and_the_rest_lands(store_url, settings, drain):
    from forge_store._schema import utcnow
    from forge_store._write.op_codec import unpack_op

    with open_store(store_url, journal=True, settings=settings, drain=drain) as st:
        for i in range(10):
            st.record_call(make_call(f"c{i}", f"r{i % 4}", i // 4))
        st._writer.submit({"k": "run", "r": {"id": None, "name": "poison", "config": None, "created_at": utcnow()}})
        for i in range(10, 20):
            st.record_call(make_call(f"c{i}", f"r{i % 4}", i // 4))
        assert st.flush(30)
        assert st.writer_status()["dead_letters"] == 1
    (kept,) = (settings.resolved_journal_dir() / "dead-letter").glob("*.msgpack")
    assert unpack_op(kept.read_bytes())["r"]["name"] == "poison"
    _check_exactly_once(store_url, settings, [f"c{i}" for i in range(20)])


@pytest.mark.parametrize("drain", ["thread", "process"])
def test_prompt_ids_text_that_is_not_ids_is_dead_lettered_and_the_rest_lands(store_url, settings, drain):
    """The proxy journals an engine's prompt ids as text (IdsText) and only the writer checks them in full: an id
    no tokenizer has (past uint32) costs that call a dead letter, and the calls of other rollouts land."""
    from forge_store._tokens import IdsText
    from forge_store._write.op_codec import unpack_op

    with open_store(store_url, journal=True, settings=settings, drain=drain) as st:
        for i in range(20):
            rec = make_call(f"c{i}", f"r{i % 4}", i // 4)
            rec.prompt_token_ids = IdsText(b"1,4294967296,3" if i == 19 else ",".join(map(str, rec.prompt_token_ids)).encode())
            st.record_call(rec)
        assert st.flush(30)
        assert st.writer_status()["dead_letters"] == 1
    (kept,) = (settings.resolved_journal_dir() / "dead-letter").glob("*.msgpack")
    assert unpack_op(kept.read_bytes())["r"]["id"] == "c19"  # the last call of its rollout: nothing builds on it
    _check_exactly_once(store_url, settings, [f"c{i}" for i in range(19)])


@pytest.mark.parametrize("drain", ["thread", "process"])
def test_completion_ids_that_cannot_be_stored_are_dead_lettered_and_the_rest_lands(store_url, settings, drain):
    """Completion ids and logprobs are journaled as lists and packed by the database side: an id outside uint32
    costs its call a dead letter there, and every other call lands (without a journal it is refused at once)."""
    from forge_store._tokens import IdsText
    from forge_store._write.op_codec import unpack_op

    with open_store(store_url, journal=True, settings=settings, drain=drain) as st:
        for i in range(20):
            rec = make_call(f"c{i}", f"r{i % 4}", i // 4)
            rec.prompt_token_ids = IdsText(",".join(map(str, rec.prompt_token_ids)).encode())  # as the proxy has them
            if i == 19:
                rec.completion_token_ids = [1, 2**32, 3]
            st.record_call(rec)
        assert st.flush(30)
        assert st.writer_status()["dead_letters"] == 1
    (kept,) = (settings.resolved_journal_dir() / "dead-letter").glob("*.msgpack")
    assert unpack_op(kept.read_bytes())["r"]["id"] == "c19"
    _check_exactly_once(store_url, settings, [f"c{i}" for i in range(19)])
    with open_store(store_url, journal=False, settings=settings) as st:
        rec = make_call("d0", "rd", 0, completion_ids=[-1])
        rec.prompt_token_ids = IdsText(b"1,2,3")
        with pytest.raises(InvalidRecord, match=r"call d0: completion token ids .* 0 <= id < 2\*\*32"):
            st.record_call(rec)
        rec.prompt_token_ids = [1, 2, 3]  # with the ids as a list the encoder packs them, and refuses there
        with pytest.raises(InvalidRecord, match=r"out of range in \[-1\]"):
            st.record_call(rec)
        rec.completion_token_ids = [5]  # nothing was half-recorded: the same call, mended, lands
        st.record_call(rec)
        assert st.call("d0").completion_token_ids == [5]
