"""``openforge erase`` on synthetic stores, on real SQLite and the real PostgreSQL: what goes, what stays shared,
dry runs, tombstones, journals and dead letters, snapshots and lakes, exports, retention, and a run killed with -9
at every step that a rerun finishes to the same end state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from forge_store import EraseError, Selection, Settings, erase, open_store, tombstones
from forge_store._cli import store_app
from forge_store._erase_cli import erase_command
from forge_store._lake import lake_snapshot
from forge_store._snapshot import snapshot
from forge_store._write.op_codec import pack_op
from learner import ExportConfig, export, verify
from tests.conftest import T0, make_call
from tests.test_erase_proxy import _grep as _grep_for

SECRET = "QX7-ACME-cust-99Z4471"   # a customer reference: no redaction rule knows it


def _grep(*roots: Path) -> list[str]:
    return _grep_for(*roots, secret=SECRET)


def build(store_url: str, home: Path, *, journal: bool = True) -> Settings:
    """Two groups of two rollouts; ``r-secret``'s second call carries SECRET in a tool result, and its reward's
    evidence blob holds it too; the store's writes go through a journal (left on disk) and a dead letter holds a
    copy of one of its calls."""
    settings = Settings(home=home)
    st = open_store(store_url, journal=journal, name="w", settings=settings)
    st.register_task("t1")
    for g, rids in (("g1", ("r-secret", "r-kept")), ("g2", ("r-a", "r-b"))):
        st.create_group(g, task_id="t1", target_size=2)
        for rid in rids:
            st.start_rollout(rid, group_id=g, task_id="t1", started_at=T0)
            for turn in range(3):
                rec = make_call(f"{rid}-{turn}", rid, turn)
                if rid == "r-secret" and turn == 1:
                    rec.messages[-1]["content"] = f"customer record: {SECRET} (do not share)"
                st.record_call(rec)
            st.finish_rollout(rid, "success" if rid != "r-b" else "failure")
            evidence = st.put_blob(f"verifier log of {rid}: {SECRET if rid == 'r-secret' else 'ok'}".encode(),
                                   "text/plain")
            st.add_reward(rid, 1.0 if rid != "r-b" else 0.0, evidence_blob=evidence)
    assert st.flush(30)
    st.close()
    dead = home / "journal" / "w" / "dead-letter"
    dead.mkdir(parents=True, exist_ok=True)
    (dead / "1-call.msgpack").write_bytes(pack_op({"k": "call", "r": {"id": "r-secret-9", "rollout_id": "r-secret"},
                                                   "msgs": {"x" * 64: ["tool", SECRET]}}))
    return settings


def test_pattern_erasure_removes_every_copy_and_leaves_the_rest(store_url, tmp_path):
    home = tmp_path / "home"
    settings = build(store_url, home)
    st = open_store(store_url, settings=settings)
    before_other = st.trajectory("r-kept")
    early = export(st, tmp_path / "early", ExportConfig(format="sft"), as_of=1)   # before any rollout
    full = export(st, tmp_path / "full", ExportConfig(format="verl"))
    snapshot(st.engine, tmp_path / "snap")
    lake_snapshot(st.engine, tmp_path / "lake")

    dry = erase(st, Selection(pattern=SECRET), reason="customer data in a tool result")
    assert dry.tombstone_id is None and dry.counts["rollouts"] == 1 and dry.counts["calls"] == 3
    assert dry.counts["messages"] == 1 and dry.counts["blobs"] == 1 and dry.counts["exports"] == 1
    assert st.counts()["calls"] == 12 and tombstones(st) == []

    done = erase(st, Selection(pattern=SECRET), reason="customer data in a tool result", actor="dpo", apply=True)
    assert done.applied and done.counts["journal_records"] >= 1 and done.counts["dead_letters"] == 1
    assert [s["export_id"] for s in done.shards] == [full["export_id"]]
    [t] = tombstones(st)
    assert (t.state, t.actor, t.reason) == ("done", "dpo", "customer data in a tool result")
    assert SECRET not in json.dumps(t.selection) and t.selection["pattern"]["chars"] == len(SECRET)
    # the rest is intact: the other rollout of the group reconstructs as before, with its shared messages
    assert st.trajectory("r-kept") == before_other
    assert st.counts()["calls"] == 9 and st.counts()["rollouts"] == 3 and st.counts()["erasure_items"] == 0
    assert verify(tmp_path / "early" / "manifest.json", st)["ok"]
    res = verify(tmp_path / "full" / "manifest.json", st)
    assert not res["ok"] and f"erased since by erasure {t.id}" in res["problems"][0], res["problems"]
    again = export(st, tmp_path / "again", ExportConfig(format="verl"))
    assert again["exclusions"]["erased"] == 1
    st.close()
    db_files = [Path(store_url.removeprefix("sqlite:///"))] if store_url.startswith("sqlite") else []
    assert _grep(home, tmp_path / "snap", tmp_path / "lake", *db_files) == []
    if not db_files:
        assert SECRET.encode() not in _pg_dump(store_url)
    # idempotent: a second run finds nothing and changes nothing
    st = open_store(store_url, settings=settings)
    second = erase(st, Selection(pattern=SECRET), reason="again")
    assert second.tombstone_id is None and second.counts["rollouts"] == 0 and len(tombstones(st)) == 1
    st.close()


def _pg_dump(url: str) -> bytes:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return subprocess.run(["pg_dump", "-h", u.host or "127.0.0.1", "-p", str(u.port or 5432), "-U", u.username,
                           u.database], capture_output=True, check=True).stdout


def test_selection_by_task_harness_version_and_time(store_url, tmp_path):
    settings = Settings(home=tmp_path / "home")
    st = open_store(store_url, settings=settings)
    h = st.register_harness("react", "1")
    st.register_task("t1")
    st.register_task("t2")
    for i, (task, pv) in enumerate((("t1", "p1"), ("t1", "p2"), ("t2", "p1"))):
        st.start_rollout(f"r{i}", task_id=task, policy_version_id=pv, harness_id=h if i else None,
                         started_at=T0 + timedelta(days=i))
        st.record_call(make_call(f"c{i}", f"r{i}", 0))
    assert erase(st, Selection(tasks=("t1",)), reason="x").counts["tasks"] == 1
    assert erase(st, Selection(harnesses=("react",)), reason="x").counts["rollouts"] == 2
    assert erase(st, Selection(policy_versions=("p1",), until=T0 + timedelta(days=1)), reason="x").counts[
        "rollouts"] == 1
    r = erase(st, Selection(tasks=("t1",)), reason="licence withdrawn", apply=True)
    assert r.counts["rollouts"] == 2 and {x["id"] for x in st.lineage("tasks")} == {"t2"}
    assert [i.id for i in st.iter_rollouts()] == ["r2"]
    st.close()


def test_nothing_selected_is_refused_naming_the_flags():
    with pytest.raises(Exception, match="--rollout, --task"):
        Selection()
    with pytest.raises(Exception, match="at least 4"):
        Selection(pattern="ab")


def test_a_journal_in_use_is_reported_and_a_rerun_finishes(tmp_path):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    settings = build(url, tmp_path / "home")
    holder = open_store(url, journal=True, name="w", settings=settings)   # a running writer holds it
    st = open_store(url, settings=settings)
    with pytest.raises(EraseError, match="in use by a running writer"):
        erase(st, Selection(rollouts=("r-secret",)), reason="leak", apply=True)
    assert [t.state for t in tombstones(st)] == ["erasing"]
    holder.close()
    r = erase(st, Selection(rollouts=("r-secret",)), reason="leak", apply=True)
    assert r.resumed and [t.state for t in tombstones(st)] == ["done"]
    st.close()
    assert _grep(tmp_path / "home") == []


def _state(url: str, home: Path, snap: Path) -> dict:
    st = open_store(url, settings=Settings(home=home))
    counts = {k: v for k, v in st.counts().items() if k not in ("ingest_counter",)}
    out = {"counts": counts, "rollouts": sorted(i.id for i in st.iter_rollouts()),
           "tombstones": [(t.state, t.counts.get("rollouts")) for t in tombstones(st)],
           "blobs": sorted(p.name for p in (home / "blobs").rglob("*") if p.is_file()),
           "snapshot": {k: v["rows"] for k, v in json.loads((snap / "manifest.json").read_text())["tables"].items()},
           "secret": _grep(home, snap)}
    st.close()
    return out


_KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from forge_store import Selection, Settings, erase, open_store
    st = open_store({url!r}, settings=Settings(home={home!r}))
    def step(name):
        if name == {at!r}:
            os.kill(os.getpid(), signal.SIGKILL)
    erase(st, Selection(pattern={secret!r}), reason="leak", apply=True, step=step)
""")


@pytest.mark.parametrize("at", ["record", "journals", "database", "blobs", "snapshots", "shards"])
def test_kill_9_mid_erase_then_rerun_gives_the_same_end_state(store_url, tmp_path, at):
    ends = []
    for name, kill in (("whole", None), ("killed", at)):
        url = store_url if name == "killed" else f"sqlite:///{tmp_path / 'whole.sqlite'}"   # the reference run
        home, snap = tmp_path / name / "home", tmp_path / name / "snap"
        build(url, home)
        st = open_store(url, settings=Settings(home=home))
        snapshot(st.engine, snap)
        st.close()
        if kill:
            code = _KILLER.format(root=str(Path(__file__).parents[1]), url=url, home=str(home), at=kill,
                                  secret=SECRET)
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
            assert proc.returncode == -signal.SIGKILL, proc.stderr
        st = open_store(url, settings=Settings(home=home))
        erase(st, Selection(pattern=SECRET), reason="leak", apply=True)
        st.close()
        ends.append(_state(url, home, snap))
    assert ends[0] == ends[1]
    assert ends[1]["secret"] == [] and ends[1]["tombstones"] == [("done", 1)]


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("erase")(erase_command)
    app.add_typer(store_app, name="store")
    return app


def test_erase_and_retain_commands_dry_run_first(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    build(url, tmp_path / "home")
    monkeypatch.setenv("OPENFORGE_HOME", str(tmp_path / "home"))
    (tmp_path / "p").write_text(SECRET + "\n")
    runner = CliRunner()
    r = runner.invoke(_app(), ["erase", "--pattern-file", str(tmp_path / "p"), "--reason", "leak", "--store", url])
    assert r.exit_code == 0 and "dry run" in r.output and SECRET not in r.output, r.output
    r = runner.invoke(_app(), ["erase", "--reason", "leak", "--store", url])
    assert r.exit_code == 2 and "selects nothing" in r.output
    r = runner.invoke(_app(), ["store", "retain", "--older-than", "90", "--store", url])
    assert r.exit_code == 2 and "90d (days)" in " ".join(r.output.split())
    st = open_store(url, settings=Settings(home=tmp_path / "home"))   # r-a is an evaluation rollout
    with st.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE rollouts SET metadata = '{\"purpose\": \"eval\"}' WHERE id = 'r-a'")
    st.close()
    r = runner.invoke(_app(), ["store", "retain", "--older-than", "90d", "--keep", "evaluation", "--store", url])
    assert r.exit_code == 0 and "dry run" in r.output, r.output
    r = runner.invoke(_app(), ["store", "retain", "--older-than", "90d", "--keep", "evaluation", "--yes",
                               "--store", url])
    assert r.exit_code == 0, r.output
    st = open_store(url, settings=Settings(home=tmp_path / "home"))
    assert [i.id for i in st.iter_rollouts()] == ["r-a"]
    [t] = tombstones(st)
    assert t.actor == "retention" and t.reason == "retention: older than 90d, keeping evaluation"
    st.close()
    assert os.path.exists(tmp_path / "home")


def test_a_blanked_journal_record_replays_as_nothing(tmp_path):
    """A record an erasure blanked in place, still pending in its journal, is skipped by the writer; the records
    around it are applied."""
    from forge_store._erase_copies import _same_length
    from forge_store._write.journal import Journal

    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    settings = Settings(home=tmp_path / "home")
    open_store(url, settings=settings).close()
    op = {"k": "task", "r": {"id": "t9", "source": None, "domain": None, "instruction_hash": None,
                             "verifier_hash": None, "environment_ref": None, "metadata": None, "created_at": T0}}
    with Journal(tmp_path / "home" / "journal" / "w") as j:
        j.append(_same_length(None, 300))
        j.append(pack_op(op))
    st = open_store(url, journal=True, name="w", settings=settings)
    assert st.flush(30)
    assert [t["id"] for t in st.lineage("tasks")] == ["t9"]
    st.close()


def test_retention_keeps_what_an_export_took_as_data(tmp_path):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    settings = build(url, tmp_path / "home")
    st = open_store(url, settings=settings)
    m = export(st, tmp_path / "sft", ExportConfig(format="sft", where="outcome = 'success'"))
    assert m["exclusions"] == {"filtered": 1}   # r-b failed: an exclusion row, not data
    r = erase(st, Selection(until=T0 + timedelta(days=1), keep=("exported",)), reason="retention", apply=True)
    assert r.counts["rollouts"] == 1
    assert sorted(i.id for i in st.iter_rollouts()) == ["r-a", "r-kept", "r-secret"]
    st.close()


def test_calls_a_live_rollout_records_after_its_erasure_are_erased_by_a_rerun(tmp_path):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    st = open_store(url, settings=Settings(home=tmp_path / "home"))
    st.start_rollout("r1", task_id="t1")
    st.record_call(make_call("c0", "r1", 0))
    first = erase(st, Selection(rollouts=("r1",)), reason="opt-out", apply=True)
    assert first.counts["running"] == 1   # the command warns: a live harness records again
    st.record_call(make_call("c1", "r1", 1))   # the harness went on
    again = erase(st, Selection(rollouts=("r1",)), reason="opt-out", apply=True)
    assert again.counts["calls"] == 1 and st.counts()["calls"] == 0
    st.close()
