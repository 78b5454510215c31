"""The data-lake tier (issue 23): incremental Parquet partitions by watermark, manifest last, read by DuckDB with
the query of docs/data-lake.md, on a folder and on a real S3-compatible server (SeaweedFS)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest

from forge_store import ObjectStoreError, open_location, open_store
from forge_store._duckdb_views import _extension
from forge_store._lake import LakeError, lake_manifests, lake_snapshot, lake_sql, lake_tables
from tests.doubles.seaweedfs import SeaweedFS
from tests.conftest import make_call

DOC = Path(__file__).resolve().parents[1] / "docs" / "data-lake.md"


def doc_query() -> str:
    """The DuckDB query docs/data-lake.md gives (the first sql block that reads the lake)."""
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)
    return next(b for b in blocks if "read_parquet('LAKE/" in b)


def _seed(st, calls: range, rollout: str) -> None:
    st.start_rollout(rollout, task_id="t")
    for i in calls:
        st.record_call(make_call(f"c{i}", rollout, i))


def _tokens(calls: range, rollout: str) -> int:
    return sum(len(make_call(f"c{i}", rollout, i).prompt_token_ids) for i in calls)


def _s3_duckdb(seaweedfs: SeaweedFS) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"LOAD '{_extension('httpfs')}'")
    con.execute(f"CREATE SECRET lake (TYPE s3, KEY_ID '{seaweedfs.access_key}', SECRET '{seaweedfs.secret_key}', "
                f"REGION 'us-east-1', ENDPOINT '{seaweedfs.endpoint.removeprefix('http://')}', URL_STYLE 'path', "
                "USE_SSL false)")
    return con


def _check_incremental(st, lake_url: str, settings, con: duckdb.DuckDBPyConnection) -> None:
    _seed(st, range(0, 6), "r0")
    first = lake_snapshot(st.engine, lake_url, settings=settings)
    assert first["from_watermark"] == 0 and first["tables"]["calls"]["rows"] == 6
    lake = open_location(lake_url, settings)
    before = {k: lake.get_bytes(k) for k in lake.list()}
    assert con.execute(doc_query().replace("LAKE", lake_url)).fetchall() == [("r0", "running", None, 6, _tokens(range(6), "r0"))]

    _seed(st, range(6, 10), "r1")  # more writes: a new rollout, and r0 finishes
    st.finish_rollout("r0", "success")
    st.add_reward("r0", 1.0)
    second = lake_snapshot(st.engine, lake_url, settings=settings)
    assert (second["from_watermark"], second["to_watermark"]) == (first["to_watermark"], st.watermark())
    rows = {t: info["rows"] for t, info in second["tables"].items()}
    assert rows["calls"] == 4 and rows["rewards"] == 1 and rows["rollouts"] == 2  # r0's finished version, r1
    assert rows["tasks"] == 0 and set(rows) == {t.name for t in lake_tables()}
    after = {k: lake.get_bytes(k) for k in lake.list()}
    assert {k: after[k] for k in before} == before  # old partitions (and the first manifest) untouched
    added = sorted(set(after) - set(before))
    assert all(f"lake_wm={second['to_watermark']}/" in k for k in added if not k.startswith("_snapshots/"))
    assert [m["to_watermark"] for m in lake_manifests(lake)] == [first["to_watermark"], second["to_watermark"]]

    assert con.execute(doc_query().replace("LAKE", lake_url)).fetchall() == [
        ("r0", "finished", "success", 6, _tokens(range(6), "r0")),
        ("r1", "running", None, 4, _tokens(range(6, 10), "r1"))]
    n = con.execute(f"SELECT count(*) FROM ({lake_sql(lake_url, 'calls')})").fetchone()[0]
    assert n == st.counts()["calls"] == 10
    assert lake_snapshot(st.engine, lake_url, settings=settings) == second  # nothing new: nothing written
    assert sorted(lake.list()) == sorted(after)


def test_lake_on_a_folder_grows_by_watermark_and_duckdb_reads_it(store_url, settings, tmp_path):
    with open_store(store_url, settings=settings) as st:
        _check_incremental(st, str(tmp_path / "lake"), settings, duckdb.connect())
    manifest = json.loads(next((tmp_path / "lake" / "_snapshots").glob("*.json")).read_text())
    assert manifest["format"] == "openforge-lake" and manifest["format_version"] == 1


def test_lake_on_s3_grows_by_watermark_and_duckdb_reads_it_there(seaweedfs, s3_url, s3_settings, tmp_path):
    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}", settings=s3_settings) as st:
        _check_incremental(st, s3_url, s3_settings, _s3_duckdb(seaweedfs))


def test_a_lake_holds_one_store_and_only_grows(settings, tmp_path):
    lake = str(tmp_path / "lake")
    with open_store(f"sqlite:///{tmp_path / 'a.sqlite'}", settings=settings) as st:
        _seed(st, range(3), "r0")
        lake_snapshot(st.engine, lake)
        with pytest.raises(LakeError, match="behind the lake"):
            lake_snapshot(st.engine, lake, as_of=1)
    with open_store(f"sqlite:///{tmp_path / 'b.sqlite'}", settings=settings) as other:
        _seed(other, range(5), "r9")
        with pytest.raises(LakeError, match="a lake holds one store"):
            lake_snapshot(other.engine, lake)


def test_a_server_gone_mid_lake_snapshot_leaves_it_incomplete_and_the_next_run_repairs_it(tmp_path, settings):
    server = SeaweedFS(tmp_path / "weed", buckets=("lake",)).start()
    s3 = server.settings()
    lake_url = "s3://lake/l"
    try:
        with open_store(f"sqlite:///{tmp_path / 's.sqlite'}", settings=settings) as st:
            _seed(st, range(4), "r0")
            lake_snapshot(st.engine, lake_url, settings=s3)
            _seed(st, range(4, 9), "r1")
            uploaded: list[str] = []

            def kill_after_three(name: str) -> None:
                uploaded.append(name)
                if len(uploaded) == 3:
                    server.stop()

            with pytest.raises(ObjectStoreError, match=r"s3://lake/l/.* failed: .*reachable"):
                lake_snapshot(st.engine, lake_url, settings=s3, uploaded=kill_after_three)
            server.start()
            con = _s3_duckdb(server)
            lake = open_location(lake_url, s3)
            assert len(lake_manifests(lake)) == 1  # the cut snapshot is not part of the lake ...
            assert sum(f"lake_wm={st.watermark()}/" in k for k in lake.list()) == 3  # ... though 3 files landed
            calls = f"SELECT count(*) FROM ({lake_sql(lake_url, 'calls')})"
            assert con.execute(calls).fetchone()[0] == 4  # readers see only complete snapshots
            _seed(st, range(9, 11), "r2")
            third = lake_snapshot(st.engine, lake_url, settings=s3)  # drops the cut partition, writes a whole one
            assert third["from_watermark"] < third["to_watermark"] and third["tables"]["calls"]["rows"] == 7
            assert con.execute(calls).fetchone()[0] == 11 == st.counts()["calls"]
            raw = f"SELECT count(*) FROM read_parquet('{lake_url}/calls/*/*.parquet')"
            assert con.execute(raw).fetchone()[0] == 11  # no file of the cut run is left to double-count
    finally:
        server.stop()


def test_cli_writes_a_lake_and_a_snapshot_to_s3_with_credentials_from_the_environment(seaweedfs, s3_url, tmp_path):
    from tests.test_cli import run

    home = tmp_path / "home"
    with open_store(f"sqlite:///{home / 'store.sqlite'}") as st:
        _seed(st, range(3), "r0")
        wm = st.watermark()
    env = {"OPENFORGE_S3_ENDPOINT": seaweedfs.endpoint, "AWS_ACCESS_KEY_ID": seaweedfs.access_key,
           "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        out = run("store", "lake", "--to", f"{s3_url}/lake", home=home).stdout
        assert "lake s3://" in out and "watermark 0 ->" in out
        run("store", "snapshot", "--to", f"{s3_url}/snap", home=home)
        mp.setenv("OPENFORGE_S3_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
        mp.setenv("OPENFORGE_S3_MAX_RETRIES", "0")
        bad = run("store", "lake", "--to", f"{s3_url}/lake2", home=home, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "s3://openforge/" in bad.stderr and "reachable" in bad.stderr
    loc = open_location(s3_url, seaweedfs.settings())
    assert [k for k in loc.list() if k.endswith(".json")] == [f"lake/_snapshots/{wm:012d}.json",
                                                                 "snap/manifest.json"]
    assert not any(k.startswith("lake2/") for k in loc.list())


def test_a_second_writer_that_finishes_first_makes_the_first_one_stop_and_clean_up(settings, tmp_path):
    lake = str(tmp_path / "lake")
    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}", settings=settings) as st:
        _seed(st, range(3), "r0")
        w1 = st.watermark()
        _seed(st, range(3, 6), "r1")
        raced: list[dict] = []

        def other_writer(table: str, n: int) -> None:
            if not raced:
                raced.append(lake_snapshot(st.engine, lake))  # runs to the current watermark, finishes first

        with pytest.raises(LakeError, match="another writer added a snapshot"):
            lake_snapshot(st.engine, lake, as_of=w1, progress=other_writer)
    assert [m["to_watermark"] for m in lake_manifests(open_location(lake))] == [raced[0]["to_watermark"]]
    assert not any(f"lake_wm={w1}/" in k for k in open_location(lake).list())  # the loser's files are gone
    n = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{lake}/calls/*/*.parquet')").fetchone()[0]
    assert n == 6


def test_a_column_added_by_a_later_migration_is_read_from_every_partition(tmp_path):
    """Older partitions lack a column a migration added later: readers merge by name, never keep the first file's
    columns (DuckDB's default, silently)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for wm, table in ((1, pa.table({"id": ["a"], "status": ["done"]})),
                      (2, pa.table({"id": ["b"], "status": ["done"], "task_version_id": ["tv1"]}))):
        part = tmp_path / "rollouts" / f"lake_wm={wm}"
        part.mkdir(parents=True)
        pq.write_table(table, part / "part-00000.parquet")
        (tmp_path / "_snapshots").mkdir(exist_ok=True)
        (tmp_path / "_snapshots" / f"{wm}.json").write_text(json.dumps({"to_watermark": wm}))
    for sql in (lake_sql(str(tmp_path), "rollouts"), doc_query().replace("LAKE", str(tmp_path))):
        assert "union_by_name = true" in sql
    rows = duckdb.connect().execute(f"SELECT id, task_version_id FROM ({lake_sql(str(tmp_path), 'rollouts')}) "
                                    "ORDER BY id").fetchall()
    assert rows == [("a", None), ("b", "tv1")]
