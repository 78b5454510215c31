"""DuckDB views over the live store (SQLite and PostgreSQL scanners, loaded by file path) and over a snapshot, in a
folder or at an s3:// URL on a real S3-compatible server (SeaweedFS)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from forge_store import ObjectStoreError, SchemaMismatch, StoreURLError, open_store
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


def _rows(con, view: str) -> list:
    return sorted(con.execute(f"SELECT * FROM {view}").fetchall(), key=repr)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # the source of the snapshot does not matter here
def test_views_over_an_s3_snapshot_match_the_folder_snapshot(seeded, s3_url, s3_settings, seaweedfs, tmp_path,
                                                              monkeypatch):
    url, counts = seeded
    engine = create_engine(url)
    snapshot(engine, tmp_path / "snap")
    snapshot(engine, s3_url, settings=s3_settings)
    engine.dispose()
    folder, remote = connect(str(tmp_path / "snap")), connect(s3_url, s3_settings)
    _check_views(remote, counts)
    for view in ANALYSIS_VIEWS:
        assert _rows(remote, view) == _rows(folder, view), view
    secrets = remote.execute("SELECT type, secret_string FROM duckdb_secrets()").fetchall()
    assert [t for t, _ in secrets] == ["s3"] and seaweedfs.secret_key not in secrets[0][1]

    from openforge.cli import build_app

    for k, v in {"OPENFORGE_HOME": str(tmp_path / "home"), "OPENFORGE_S3_ENDPOINT": seaweedfs.endpoint,
                 "AWS_ACCESS_KEY_ID": seaweedfs.access_key, "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key}.items():
        monkeypatch.setenv(k, v)
    query = "SELECT id, status, reward, reward_source FROM rollouts ORDER BY id"
    app, runner, out = build_app(), CliRunner(), {}
    for name, source in (("folder", str(tmp_path / "snap")), ("s3", s3_url)):
        res = runner.invoke(app, ["sql", query, "--store", source, "--csv", str(tmp_path / f"{name}.csv")])
        assert res.exit_code == 0, res.output
        out[name] = (tmp_path / f"{name}.csv").read_text()
    assert out["s3"] == out["folder"] and out["s3"].count("\n") == counts["rollouts"] + 1

    res = runner.invoke(app, ["sql", query, "--store", f"{s3_url}/not-a-snapshot"])
    said = " ".join(res.output.split())  # rich wraps long lines
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert f"no {s3_url}/not-a-snapshot/manifest.json" in said and "openforge store snapshot --to" in said
    assert seaweedfs.secret_key not in res.output


def test_bad_s3_snapshots_say_what_to_pass(s3_url, s3_settings, tmp_path):
    with pytest.raises(StoreURLError, match=r"no snapshot there \(no s3://openforge/.*/manifest.json\).*--to"):
        connect(s3_url, s3_settings)
    from forge_store import open_location

    loc = open_location(s3_url, s3_settings)
    loc.put_bytes("old/manifest.json", b'{"format": "openforge-snapshot", "tables": {"calls": {"file": "c.parquet"}}}')
    with pytest.raises(SchemaMismatch, match=r"lacks tables \[.*rollouts.*\].*openforge store snapshot"):
        connect(f"{s3_url}/old", s3_settings)
    loc.put_bytes("junk/manifest.json", b"not json")
    with pytest.raises(StoreURLError, match="is not an OpenForge snapshot manifest"):
        connect(f"{s3_url}/junk", s3_settings)
    gone = s3_settings.model_copy(update={"s3_endpoint": "http://127.0.0.1:9", "s3_max_retries": 0})
    with pytest.raises(ObjectStoreError, match=r"reading s3://openforge/.*manifest.json failed.*127.0.0.1:9 is reachable"):
        connect(s3_url, gone)
