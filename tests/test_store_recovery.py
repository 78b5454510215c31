"""The store's side of issue 22: ``openforge store drain`` drains every journal left behind (naming each with its
count), ``--name`` one; ``store check-calls``; files that hold prompts are owner-only whatever the umask; a store
opened offline journals, then checks the schema and drains once the database answers; the rollout ledger."""

from __future__ import annotations

import os
import stat

import pytest
import sqlalchemy as sa

from forge_store import Settings, open_store
from forge_store._write.db_apply import BatchApplier
from proxy._rollout_ledger import LedgerError, RolloutLedger
from tests.conftest import make_call
from tests.netfault import TcpRelay
from tests.test_cli import run

GONE = "postgresql+psycopg://x@127.0.0.1:1/x"  # nothing listens there


def _leave_journal(home, name: str, n: int, prefix: str) -> None:
    """A writer (journal ``name``) that wrote ``n`` calls and died before its database side applied them."""
    st = open_store(journal=True, name=name, settings=Settings(home=home, writer_retry_max_s=0.1))
    st._writer.engine = sa.create_engine(GONE)  # its database went away
    for i in range(n):
        st.record_call(make_call(f"{prefix}{i}", f"r-{prefix}", i))
    st.close(timeout=0.1)


def test_drain_drains_every_journal_left_behind_and_names_each(tmp_path):
    home = tmp_path / "h"
    _leave_journal(home, "proxy", 7, "p")
    _leave_journal(home, "default", 3, "d")
    out = run("store", "drain", home=home).stdout
    assert "journal 'default': drained 3 operations" in out and "journal 'proxy': drained 7 operations" in out, out
    ids = tmp_path / "ids"
    ids.write_text("".join(f"p{i}\n" for i in range(7)) + "d0\n")
    assert "8 of 8 call ids are in the store" in run("store", "check-calls", str(ids), home=home).stdout
    ids.write_text("p0\nnot-a-call\n")
    proc = run("store", "check-calls", str(ids), home=home, check=False)
    assert proc.returncode == 1 and "not-a-call" in proc.stderr


def test_drain_name_selects_one_and_an_unknown_name_is_an_error(tmp_path):
    home = tmp_path / "h"
    _leave_journal(home, "proxy", 4, "p")
    _leave_journal(home, "other", 2, "o")
    out = run("store", "drain", "--name", "proxy", home=home).stdout
    assert "journal 'proxy': drained 4 operations" in out and "other" not in out
    proc = run("store", "drain", "--name", "nope", home=home, check=False)
    assert proc.returncode == 2 and "no journal named 'nope'" in proc.stderr and "other, proxy" in proc.stderr
    assert "nothing to drain" in run("store", "drain", home=tmp_path / "empty").stdout


def test_drain_refuses_a_journal_its_writer_still_owns(tmp_path):
    home = tmp_path / "h"
    st = open_store(journal=True, name="proxy", settings=Settings(home=home))
    try:
        proc = run("store", "drain", home=home, check=False)
        assert proc.returncode == 2 and "in use by a running writer" in proc.stderr
    finally:
        st.close()


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_store_and_journal_files_are_owner_only_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        home = tmp_path / "h"
        settings = Settings(home=home)
        with open_store(journal=True, name="proxy", settings=settings) as st:
            st.record_call(make_call("c0", "r", 0))
            assert st.flush(10)
            db = home / "store.sqlite"
            for path in (db, db.with_name("store.sqlite-wal"), db.with_name("store.sqlite-shm")):
                assert _mode(path) == 0o600, path
            journal = home / "journal" / "proxy"
            assert _mode(home / "journal") == 0o700 and _mode(journal) == 0o700
            files = [p for p in journal.iterdir() if p.is_file()]
            assert any(p.suffix == ".log" for p in files) and (journal / "LOCK") in files
            assert all(_mode(p) == 0o600 for p in files), {p.name: oct(_mode(p)) for p in files}
        assert _mode(journal / "CHECKPOINT") == 0o600
        # a dead letter (an operation the database refuses for good)
        applier = BatchApplier(journal / "dead-letter", 0.1)
        engine = sa.create_engine(f"sqlite:///{db}")
        assert applier.apply(engine, [{"k": "task", "r": {"id": None}}], lambda _: False)
        engine.dispose()
        letters = list((journal / "dead-letter").iterdir())
        assert applier.dead_letters == 1 and len(letters) == 1
        assert _mode(journal / "dead-letter") == 0o700 and _mode(letters[0]) == 0o600
        ledger = RolloutLedger(home / "proxy-rollouts" / "proxy.ledger", fsync=False)
        ledger.close()
        assert _mode(home / "proxy-rollouts" / "proxy.ledger") == 0o600 and _mode(home / "proxy-rollouts") == 0o700
    finally:
        os.umask(old)


def test_an_offline_store_journals_then_checks_the_schema_and_drains(pg_database, tmp_path):
    url = sa.engine.make_url(pg_database)
    relay = TcpRelay(url.host or "127.0.0.1", url.port or 5432)
    relayed = url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    relay.cut()
    settings = Settings(home=tmp_path / "h", writer_retry_max_s=0.2)
    try:
        with pytest.raises(Exception, match="cannot open the store"):
            open_store(relayed, journal=True, settings=settings)  # without offline=True: unavailable, as before
        for drain in ("thread", "process"):
            st = open_store(relayed, journal=True, name=drain, settings=settings, drain=drain, offline=True)
            try:
                for i in range(5):
                    st.record_call(make_call(f"{drain}{i}", f"r-{drain}", i))
                assert not st.flush(1.0)
                assert st.writer_status()["pending_ops"] == 5
                relay.restore()  # an empty database: the writer creates the schema, then applies
                assert st.flush(60)
                assert st.store_id and len(st.calls(f"r-{drain}")) == 5
            finally:
                st.close()
                relay.cut()
    finally:
        relay.close()


def test_the_rollout_ledger_survives_a_torn_tail_and_refuses_damage(tmp_path):
    path = tmp_path / "l" / "proxy.ledger"
    ledger = RolloutLedger(path, fsync=True)
    ledger.start("a")
    ledger.start("b")
    ledger.end("a")
    ledger.close()
    with open(path, "ab") as f:
        f.write(b'["E", "b')  # a crash during the write of b's end: never acknowledged
    ledger = RolloutLedger(path, fsync=True)
    assert ledger.started == {"a", "b"} and ledger.ended == {"a"}
    ledger.end("b")
    ledger.close()
    assert RolloutLedger(path, fsync=False).ended == {"a", "b"}
    lines = path.read_bytes().split(b"\n")
    lines[1] = b"garbage"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerError, match="line 2 is damaged"):
        RolloutLedger(path, fsync=False)
