"""Parquet snapshots: complete, readable with DuckDB, pinned to a watermark and byte-reproducible."""

from __future__ import annotations

import json

import duckdb
import pyarrow.parquet as pq

from forge_store import open_store
from forge_store._snapshot import snapshot
from tests.conftest import make_call


def _seed(st, start, n):
    for i in range(start, start + n):
        st.record_call(make_call(f"c{i}", f"r{i % 3}", i // 3))


def test_snapshot_reads_back_with_duckdb(store_url, settings, tmp_path):
    with open_store(store_url, settings=settings) as st:
        st.start_rollout("r0", task_id="t")
        _seed(st, 0, 12)
        st.finish_rollout("r0", "success")
        st.add_reward("r0", 1.0)
        counts = st.counts()
        manifest = snapshot(st.engine, tmp_path / "snap")
    assert (tmp_path / "snap" / "manifest.json").exists()
    assert json.loads((tmp_path / "snap" / "manifest.json").read_text()) == manifest
    con = duckdb.connect()
    for table, info in manifest["tables"].items():
        n = con.execute(f"SELECT count(*) FROM read_parquet('{tmp_path / 'snap' / info['file']}')").fetchone()[0]
        assert n == counts[table] == info["rows"], table
    calls = tmp_path / "snap" / "calls.parquet"
    row = con.execute(f"SELECT n_prompt_tokens, json_extract_string(request_params, '$.model') "
                      f"FROM read_parquet('{calls}') WHERE id = 'c4'").fetchone()
    assert row == (len(make_call("x", "r", 1).prompt_token_ids), "m")
    assert pq.read_schema(calls).field("completion_ids").type == "binary"
    outcome = con.execute(f"SELECT outcome FROM read_parquet('{tmp_path / 'snap' / 'rollouts.parquet'}')").fetchone()
    assert outcome == ("success",)


def test_snapshot_pinned_to_a_watermark_is_byte_identical_later(store_url, settings, tmp_path):
    with open_store(store_url, settings=settings) as st:
        st.start_rollout("r0")
        _seed(st, 0, 9)
        w = st.watermark()
        first = snapshot(st.engine, tmp_path / "a", as_of=w)
        _seed(st, 9, 9)  # new data arrives
        st.finish_rollout("r0", "failure")
        st.add_reward("r0", 0.0)
        second = snapshot(st.engine, tmp_path / "b", as_of=w)
        latest = snapshot(st.engine, tmp_path / "c")
    assert first == second
    assert latest["tables"]["calls"]["rows"] == 18 and first["tables"]["calls"]["rows"] == 9
    con = duckdb.connect()
    status = con.execute(f"SELECT status, outcome FROM read_parquet('{tmp_path / 'b' / 'rollouts.parquet'}')").fetchone()
    assert status == ("running", None)
