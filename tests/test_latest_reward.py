"""One latest-reward rule (forge_store/_rewards.py), four readers: the dashboard, ``openforge analyze``, an export's
chosen reward and advantage, and the DuckDB views agree on every rollout, with and without a source filter, including
a rollout whose later reward comes from another source."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from forge_store import InvalidRecord, Window, connect_duckdb, latest_reward, open_store
from forge_store.testing import Turn, agent_calls
from learner import ExportConfig, export, group_advantages
from learner._analysis import collect

# rollout -> the reward that counts, for each choice of sources
EXPECTED = {
    None: {"a": (0.25, "judge"), "b": (0.0, "verifier"), "c": (0.5, "judge")},
    ("verifier",): {"a": (1.0, "verifier"), "b": (0.0, "verifier"), "c": None},
}


@pytest.fixture
def seeded(store_url, settings):
    with open_store(store_url, settings=settings) as st:
        st.register_task("t", domain="swe", metadata={"reference_steps": 2})
        st.register_policy_version("p", model_name="m")
        st.create_group("g", task_id="t", target_size=2, policy_version_id="p")
        st.create_group("g2", task_id="t", target_size=1, policy_version_id="p")
        for rid, gid in (("a", "g"), ("b", "g"), ("c", "g2")):
            st.start_rollout(rid, group_id=gid, task_id="t", policy_version_id="p")
            for rec in agent_calls(rid, [Turn([("bash", {"command": "ls"})], ["ok"]), Turn(text="done")],
                                   policy_version_id="p"):
                st.record_call(rec)
            st.finish_rollout(rid, "success" if rid == "a" else "failure")
        st.add_reward("a", 1.0)
        st.add_reward("b", 0.0)
        st.add_reward("a", 0.25, source="judge")  # a re-grade from another source, ingested later
        st.add_reward("c", 0.5, source="judge")
        ids = {rid: {r.source: r.id for r in st.rewards(rid)} for rid in "abc"}
    return store_url, ids


@pytest.mark.parametrize("sources", [None, ("verifier",)], ids=["every-source", "verifier-only"])
def test_four_readers_agree(seeded, settings, tmp_path, sources):
    from dashboards._queries import rollout_page

    url, reward_ids = seeded
    want = {rid: (None if v is None else v[0]) for rid, v in EXPECTED[sources].items()}
    with open_store(url, settings=settings) as st:
        # the dashboard: the trajectory browser's page (SQL form) and its rollout view (Python form)
        page, _ = rollout_page(st, Window(), {}, reward_sources=sources)
        dashboard = {r["id"]: None if r["reward"] is None or math.isnan(r["reward"]) else r["reward"]
                     for r in page.to_dict("records")}
        assert dashboard == want
        assert {rid: getattr(latest_reward(st.rewards(rid), sources), "value", None) for rid in "abc"} == want
        # openforge analyze
        assert {f.info.id: f.reward for f in collect(st, reward_sources=sources)} == want
        # GRPO: the export's chosen reward row, its value and the group's advantages
        export(st, tmp_path / "x", ExportConfig(format="verl", reward_sources=sources), record=False)
        rows = pq.read_table(tmp_path / "x" / "trajectories-00000.parquet").to_pylist()
    exported = {r["rollout_id"]: (r["reward_score"], r["reward_source"], r["reward_id"], r["advantage"]) for r in rows}
    assert {rid: v[0] for rid, v in exported.items()} == {rid: v for rid, v in want.items() if v is not None}
    for rid, (value, source, rid_reward, _) in exported.items():
        assert (value, source) == EXPECTED[sources][rid] and rid_reward == reward_ids[rid][source]
    adv = group_advantages([want["a"], want["b"]]).advantages
    assert (exported["a"][3], exported["b"][3]) == pytest.approx(tuple(adv))
    # the DuckDB views: rollouts.reward takes every source; latest_rewards(sources) filters
    con = connect_duckdb(url)
    if sources is None:
        duck = dict(con.sql("SELECT id, reward FROM rollouts").fetchall())
        latest = dict(con.sql("SELECT rollout_id, source FROM rewards WHERE is_latest").fetchall())
        assert latest == {rid: v[1] for rid, v in EXPECTED[None].items()}
    else:
        duck = dict(con.sql(f"SELECT r.id, l.value FROM rollouts r LEFT JOIN latest_rewards({list(sources)}) l "
                            "ON l.rollout_id = r.id").fetchall())
    assert duck == want


def test_an_unknown_source_is_an_error(seeded, settings):
    from learner import AnalysisError, analyze

    url, _ = seeded
    with open_store(url, settings=settings) as st:
        with pytest.raises(InvalidRecord, match="'verifer' is not one of verifier, judge"):
            st.latest_rewards(["a"], sources=["verifer"])
        with pytest.raises(AnalysisError, match="--reward-source 'verifer'"):
            analyze(st, reward_sources=["verifer"])
        assert st.latest_rewards(["a", "b"], sources=()) == {}  # an empty choice counts no reward
