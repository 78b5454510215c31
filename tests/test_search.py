"""Full-text search over every call (issue 33), on real SQLite (FTS5 trigram) and the real PostgreSQL (pg_trgm):
what it finds, its filters, that the writer keeps it current, that migration 0006 indexes calls stored before it,
and ``openforge search``."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from forge_store import Settings, StoreError, open_store
from forge_store import _migrate as migrate
from forge_store._engine import create_engine
from forge_store._search_cli import search_command
from forge_store.testing import T0, Turn, agent_calls, seed_demo_store

PLANTED = "rm -rf /var/lib/app/cache"


def _plant(st, rid: str = "r-planted", pv: str = "policy-v2", purpose: str | None = None) -> list[str]:
    st.start_rollout(rid, task_id="task-0", policy_version_id=pv, started_at=T0,
                     metadata={"purpose": purpose} if purpose else None)
    turns = [Turn([("bash", {"command": "ls /var/lib/app"})], ["cache\nDISK_FULL_7731: no space left on device"]),
             Turn([("bash", {"command": PLANTED})], [""]), Turn(text="Freed the disk.")]
    calls = agent_calls(rid, turns, started_at=T0, policy_version_id=pv)
    for rec in calls:
        st.record_call(rec)
    st.finish_rollout(rid, "success")
    return [c.id for c in calls]


@pytest.fixture
def seeded(store_url, tmp_path):
    settings = Settings(home=tmp_path / "home")
    with open_store(store_url, settings=settings) as st:
        seed_demo_store(st, n_tasks=2, per_task=3)
        ids = _plant(st)
    return store_url, settings, ids


def test_search_finds_a_planted_command_tool_result_and_answer(seeded):
    url, settings, ids = seeded
    with open_store(url, settings=settings) as st:
        hits, more = st.search("RM -RF /var/lib")  # any case
        assert [h.call_id for h in hits] == [ids[1]] and not more  # the call that ran it; its tool call's arguments
        h = hits[0]
        assert (h.rollout_id, h.seq, h.task_id, h.policy_version_id, h.outcome) == ("r-planted", 1, "task-0",
                                                                                     "policy-v2", "success")
        assert "[[rm -rf /var/lib]]" in h.snippet
        hits, _ = st.search("DISK_FULL_7731")  # a tool result: in the prompt of the call after the one that ran ls
        assert [h.call_id for h in hits] == [ids[1]]
        assert [h.call_id for h in st.search("Freed the disk")[0]] == [ids[2]]  # an answer's text
        assert st.search("no such text anywhere")[0] == []


def test_search_filters_and_limits(seeded):
    url, settings, _ = seeded
    with open_store(url, settings=settings) as st:
        everywhere, _ = st.search("pytest -q", limit=1000)
        assert len({h.rollout_id for h in everywhere}) > 2
        v1, _ = st.search("pytest -q", policy_version_id="policy-v1", limit=1000)
        assert v1 and {h.policy_version_id for h in v1} == {"policy-v1"}
        ok, _ = st.search("pytest -q", outcome="success", limit=1000)
        assert ok and {h.outcome for h in ok} == {"success"} and len(ok) < len(everywhere)
        assert st.search("rm -rf", task_id="task-1")[0] == []
        assert st.search("rm -rf", purpose="eval")[0] == [] and st.search("rm -rf", purpose="train")[0]
        assert st.search("rm -rf", since=T0.replace(year=2027))[0] == []
        two, more = st.search("pytest -q", limit=2)
        assert len(two) == 2 and more
        with pytest.raises(StoreError, match=r"'rm': a search needs at least 3 characters.*longer piece"):
            st.search("rm")


def test_the_writer_keeps_the_index_current(store_url, tmp_path):
    """Through the journal and the background writer, as a proxy records."""
    settings = Settings(home=tmp_path / "home")
    with open_store(store_url, settings=settings, journal=True) as st:
        ids = _plant(st, "r-journaled")
        assert st.flush(30)
        assert [h.call_id for h in st.search(PLANTED)[0]] == [ids[1]]
        st.record_call(agent_calls("r-journaled", [Turn(text="x")])[0])  # the same call id again: one row
        assert st.flush(30)
        assert len(st.search(PLANTED)[0]) == 1


def test_migration_0006_indexes_calls_stored_before_it(store_url, tmp_path):
    settings = Settings(home=tmp_path / "home")
    with open_store(store_url, settings=settings) as st:
        ids = _plant(st)
    engine = create_engine(store_url)
    migrate.downgrade(engine, "0004")  # the search table goes; the calls stay
    migrate.upgrade(engine)
    engine.dispose()
    with open_store(store_url, settings=settings) as st:
        assert [h.call_id for h in st.search(PLANTED)[0]] == [ids[1]]
        assert [h.call_id for h in st.search("disk_full_7731")[0]] == [ids[1]]


def test_openforge_search_command(seeded, monkeypatch, tmp_path):
    url, _, ids = seeded
    monkeypatch.setenv("OPENFORGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "80")
    app, runner = typer.Typer(), CliRunner()  # the entry point (pyproject.toml) reaches the venv when reinstalled
    app.command("search")(search_command)
    app.command("noop")(lambda: None)  # two commands: the group keeps its sub-command names
    res = runner.invoke(app, ["search", PLANTED, "--store", url, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [h["call_id"] for h in doc["hits"]] == [ids[1]] and doc["more"] is False
    res = runner.invoke(app, ["search", "pytest -q", "--store", url, "--version", "policy-v1", "--limit", "1"])
    assert res.exit_code == 0, res.output
    assert "rollout" in res.output and "snippet" in res.output and "policy-v2" not in res.output
    assert "more hits" in res.output
    res = runner.invoke(app, ["search", "rm", "--store", url])
    assert res.exit_code == 2 and "at least 3 characters" in res.output
    res = runner.invoke(app, ["search", "rm -rf", "--store", url, "--since", "yesterday"])
    assert res.exit_code == 2 and "--since 'yesterday'" in res.output
