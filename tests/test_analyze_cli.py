"""``openforge analyze``, ``openforge sql`` and ``openforge dashboard`` from the command line, good and bad input."""

from __future__ import annotations

import csv

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from forge_store import Settings, open_store
from forge_store.testing import seed_demo_store
from openforge.cli import build_app

app = build_app()

runner = CliRunner()


@pytest.fixture
def seeded(store_url, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENFORGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "250")
    with open_store(store_url, settings=Settings(home=tmp_path / "home")) as st:
        seed_demo_store(st, n_tasks=2, per_task=4)
    return store_url


def test_analyze_prints_tables_and_writes_files(seeded, tmp_path):
    res = runner.invoke(app, ["analyze", "--store", seeded, "--csv", str(tmp_path / "csv"),
                              "--parquet", str(tmp_path / "pq"), "--k", "1", "--k", "2"])
    assert res.exit_code == 0, res.output
    for title in ("Outcomes by policy_version", "Behaviour by policy_version", "Exclusions by reason"):
        assert title in res.output
    assert "policy-v1" in res.output and "pass@2" in res.output
    with open(tmp_path / "csv" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["policy_version"] for r in rows} == {"policy-v1", "policy-v2"}
    assert float(rows[0]["pass@1"]) >= 0 and "latency_p95_s" in rows[0]
    tools = pq.read_table(tmp_path / "pq" / "tools.parquet").to_pylist()
    assert {t["tool"] for t in tools} >= {"bash", "read_file", "write_file"}


@pytest.mark.parametrize("by", ["harness", "domain"])
def test_analyze_by_other_slices(seeded, by):
    res = runner.invoke(app, ["analyze", "--store", seeded, "--by", by])
    assert res.exit_code == 0, res.output
    assert ("react@1.0" if by == "harness" else "swe") in res.output


def test_analyze_counts_rewards_from_chosen_sources(seeded, tmp_path):
    with open_store(seeded, settings=Settings(home=tmp_path / "home")) as st:
        rid = next(r.id for r in st.iter_rollouts() if r.outcome == "success" and r.policy_version_id == "policy-v2")
        st.add_reward(rid, 0.0, source="judge")  # a later re-grade of a success, by another source
    args = ["analyze", "--store", seeded, "--k", "1"]
    rates = {}
    for sources in ([], ["--reward-source", "verifier"], ["--reward-source", "judge", "--reward-source", "verifier"]):
        res = runner.invoke(app, [*args, *sources, "--csv", str(tmp_path / "csv")])
        assert res.exit_code == 0, res.output
        with open(tmp_path / "csv" / "summary.csv") as f:
            rates[len(sources)] = {r["policy_version"]: float(r["success_rate"]) for r in csv.DictReader(f)}
    assert rates[0] == rates[4] and rates[2]["policy-v1"] == rates[0]["policy-v1"]
    assert rates[2]["policy-v2"] > rates[0]["policy-v2"]  # without the judge, that success passes again
    res = runner.invoke(app, [*args, "--reward-source", "verifer"])
    assert res.exit_code == 2 and "--reward-source 'verifer'" in res.output and "verifier, judge" in res.output


def test_sql_over_the_store(seeded, tmp_path):
    res = runner.invoke(app, ["sql", "SELECT tool_name, count(*) AS n FROM tool_calls GROUP BY 1 ORDER BY 1",
                              "--store", seeded])
    assert res.exit_code == 0, res.output
    assert "bash" in res.output and "write_file" in res.output
    res = runner.invoke(app, ["sql", "SELECT id, reward FROM rollouts", "--store", seeded, "--csv",
                              str(tmp_path / "r.csv")])
    assert res.exit_code == 0 and (tmp_path / "r.csv").read_text().startswith("id,reward")
    res = runner.invoke(app, ["sql", "SELECT * FROM no_such_view", "--store", seeded])
    assert res.exit_code == 2 and "tool_calls" in res.output and "fix the query" in res.output


def test_sql_over_a_snapshot(seeded, tmp_path):
    assert runner.invoke(app, ["store", "snapshot", "--store", seeded, "--out", str(tmp_path / "snap")]).exit_code == 0
    res = runner.invoke(app, ["sql", "SELECT count(*) AS n FROM samples", "--store", str(tmp_path / "snap")])
    assert res.exit_code == 0, res.output


def test_bad_input_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENFORGE_HOME", str(tmp_path / "home"))
    empty = f"sqlite:///{tmp_path / 'empty.sqlite'}"
    for cmd in (["analyze", "--store", empty], ["dashboard", "--store", empty]):
        res = runner.invoke(app, cmd)
        assert res.exit_code == 2 and "is empty" in res.output and "openforge db upgrade" in res.output, res.output
    assert runner.invoke(app, ["sql", "SELECT 1", "--store", empty]).exit_code == 2
    url = f"sqlite:///{tmp_path / 'fresh.sqlite'}"
    open_store(url, settings=Settings(home=tmp_path / "home")).close()
    res = runner.invoke(app, ["analyze", "--store", url])
    assert res.exit_code == 1 and "no finished rollouts" in res.output
    res = runner.invoke(app, ["analyze", "--store", url, "--by", "colour"])
    assert res.exit_code == 2 and "policy_version, harness, domain" in res.output
    res = runner.invoke(app, ["analyze", "--store", url, "--since", "yesterday"])
    assert res.exit_code == 2 and "YYYY-MM-DD" in res.output
    res = runner.invoke(app, ["sql", "SELECT 1", "--store", str(tmp_path)])
    assert res.exit_code == 2 and "no manifest.json" in res.output
