"""DuckDB views over the live store (SQLite and PostgreSQL scanners, loaded by file path) and over a snapshot."""

from __future__ import annotations

import pytest

from forge_store import SchemaMismatch, StoreURLError, open_store
from forge_store._duckdb_views import ANALYSIS_VIEWS, connect
from forge_store._engine import create_engine
from forge_store._snapshot import snapshot
from forge_store.testing import Turn, agent_calls, seed_demo_store


@pytest.fixture
def seeded(store_url, settings):
    with open_store(store_url, settings=settings) as st:
        seed_demo_store(st, n_tasks=2, per_task=3)
        st.start_rollout("tc", task_id="task-0", policy_version_id="policy-v1")
        for rec in agent_calls("tc", [Turn([("bash", {"command": "ls"}), ("read_file", "{oops")], ["a", "b"]),
                                      Turn(text="done")], policy_version_id="policy-v1"):
            st.record_call(rec)
        st.finish_rollout("tc", "failure")
        st.add_reward("tc", 0.0)
        st.add_reward("tc", 0.25, source="judge")  # append-only: the later reward is the one views show
        counts = st.counts()
    return store_url, counts


def _check_views(con, counts):
    for view in ANALYSIS_VIEWS:
        con.execute(f"SELECT * FROM {view} LIMIT 1").fetchall()
    assert con.sql("SELECT count(*) FROM rollouts").fetchone()[0] == counts["rollouts"]
    assert con.sql("SELECT count(*) FROM calls").fetchone()[0] == counts["calls"]
    assert con.sql("SELECT count(*) FROM samples").fetchone()[0] == counts["calls"]
    assert con.sql("SELECT count(*) FROM rewards").fetchone()[0] == counts["rewards"]
    rows = con.sql("SELECT tool_index, tool_name, arguments, arguments_json_ok FROM tool_calls "
                   "WHERE rollout_id = 'tc' ORDER BY tool_index").fetchall()
    assert rows == [(0, "bash", '{"command": "ls"}', True), (1, "read_file", "{oops", False)]
    r = con.sql("SELECT reward, reward_source, latency_s >= 0, harness_name, domain FROM rollouts "
                "WHERE id = 'r-0-0-0'").fetchone()
    assert r == (0.0 if r[0] == 0.0 else 1.0, "verifier", True, "react", "swe")
    assert con.sql("SELECT reward, reward_source FROM rollouts WHERE id = 'tc'").fetchone() == (0.25, "judge")
    assert con.sql("SELECT count(*) FROM exclusions WHERE reason = 'infra_error'").fetchone()[0] == counts["exclusions"]
    # JSON and timestamps are typed the same whatever the source
    assert con.sql("SELECT json_extract_string(metadata, '$.reference_steps') FROM tasks LIMIT 1").fetchone() == ("4",)
    assert con.sql("SELECT typeof(started_at), typeof(token_exact) FROM calls LIMIT 1").fetchone() == ("TIMESTAMP", "BOOLEAN")


def test_views_over_live_store(seeded):
    url, counts = seeded
    con = connect(url)
    _check_views(con, counts)
    with pytest.raises(Exception, match="(?i)read.only|read-only|cannot"):
        con.execute("DELETE FROM src.rollouts")


def test_views_over_snapshot(seeded, tmp_path):
    url, counts = seeded
    engine = create_engine(url)
    snapshot(engine, tmp_path / "snap")
    engine.dispose()
    _check_views(connect(str(tmp_path / "snap")), counts)


def test_bad_sources_say_what_to_pass(tmp_path):
    with pytest.raises(StoreURLError, match="no manifest.json"):
        connect(str(tmp_path))
    with pytest.raises(StoreURLError, match="no SQLite file"):
        connect(f"sqlite:///{tmp_path / 'nope.sqlite'}")
    import sqlite3

    sqlite3.connect(tmp_path / "other.sqlite").execute("CREATE TABLE x (a)").connection.close()
    with pytest.raises(SchemaMismatch, match="openforge db upgrade"):
        connect(f"sqlite:///{tmp_path / 'other.sqlite'}")
