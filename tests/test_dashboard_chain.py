"""The Overview's success rate along the policy chain: versions ordered by their parent links (then global step, then
creation), evaluation, training and teacher rollouts as separate lines, infrastructure errors left out; read through
``store.stats`` and ``Store.lineage`` only, rendered with Streamlit's AppTest on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboards._queries import chain_order, success_along_chain
from forge_store import Settings, Window, open_store
from learner import wilson_interval

APP = str(Path(__file__).resolve().parent.parent / "dashboards" / "app.py")
CHAIN = ["base", "sft", "grpo-a", "grpo-b", "teacher-scripted", "unregistered"]
# (version, purpose or None: recorded without one, outcomes)
ROLLOUTS = [
    ("base", "eval", ["success", "failure", "failure", "failure"]),
    ("base", None, ["failure", "failure"]),
    ("teacher-scripted", "teacher", ["success"] * 4),
    ("sft", "eval", ["success", "success", "success", "failure"]),
    ("grpo-b", "eval", ["success"] * 4),
    ("grpo-b", "train", ["success", "success", "success", "failure", "infra_error"]),
    ("grpo-a", "eval", ["success", "success", "success", "failure"]),
    ("grpo-a", "train", ["success", "failure", "success", "failure"]),
    ("unregistered", "eval", ["failure"]),
]


def seed(store) -> None:
    """The loop's chain, registered out of chain order (grpo-b before its parent grpo-a; the teacher between base and
    sft), so that neither creation order nor names give the chain."""
    store.register_policy_version("base", model_name="smollm2", global_step=0)
    store.register_policy_version("teacher-scripted", model_name="scripted", metadata={"teacher": "scripted"})
    store.register_policy_version("sft", model_name="smollm2", global_step=40, metadata={"parent": "base"})
    store.register_policy_version("grpo-b", model_name="smollm2", global_step=42, metadata={"parent": "grpo-a"})
    store.register_policy_version("grpo-a", model_name="smollm2", global_step=41, metadata={"parent": "sft"})
    for version, purpose, outcomes in ROLLOUTS:
        for i, outcome in enumerate(outcomes):
            rid = f"{version}-{purpose}-{i}"
            store.start_rollout(rid, task_id=f"t{i}", policy_version_id=version,
                                metadata={"purpose": purpose, "domain": "shell"} if purpose else {"domain": "shell"})
            store.finish_rollout(rid, outcome)
    assert store.flush(30)


def chain_specs(at: AppTest) -> list[dict]:
    """The Vega-Lite specs of the chain charts on the page (a line and its interval bars, layered)."""
    specs = [json.loads(chart.proto.spec) for chart in at.get("vega_lite_chart")]
    return [s for s in specs if s.get("layer") and s["layer"][0]["encoding"].get("color", {}).get("field") == "purpose"]


@pytest.fixture
def chain_store(store_url, tmp_path):
    home = tmp_path / "home"
    with open_store(store_url, settings=Settings(home=home)) as st:
        seed(st)
    return store_url, home


def test_versions_follow_parent_links_then_global_step_then_creation():
    v = [{"id": "b", "global_step": None}, {"id": "a", "global_step": 5, "metadata": {"parent": "c"}},
         {"id": "c", "global_step": 9}, {"id": "d", "global_step": 1}, {"id": "e", "global_step": None}]
    assert [x["id"] for x in chain_order(v)] == ["d", "c", "a", "b", "e"]
    loop = [{"id": "x", "metadata": {"parent": "y"}}, {"id": "y", "metadata": {"parent": "x"}}]
    assert [x["id"] for x in chain_order(loop)] == ["x", "y"]  # a parent loop still shows every version once
    assert [x["id"] for x in chain_order([{"id": "s", "metadata": {"parent": "s"}}])] == ["s"]


def test_wilson_interval():
    assert wilson_interval(0, 0) is None
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.161, abs=1e-3)
    lo, hi = wilson_interval(3, 4)
    assert 0.2 < lo < 0.75 < hi < 1.0


def test_success_along_the_chain_from_the_stores_reads(chain_store):
    url, home = chain_store
    with open_store(url, settings=Settings(home=home)) as st:
        raw = {(r["policy_version_id"], r["purpose"]): r for r in st.stats.success_by_version(Window())}
        df = success_along_chain(st, Window())
    assert raw[("base", "train")] == {"policy_version_id": "base", "purpose": "train", "rollouts": 2, "graded": 2,
                                      "successes": 0}  # no purpose recorded: training, as the learner reads it
    assert raw[("grpo-b", "train")]["rollouts"] == 5 and raw[("grpo-b", "train")]["graded"] == 4
    assert list(dict.fromkeys(df["policy_version_id"])) == CHAIN
    rates = {(r.policy_version_id, r.purpose): r.success_rate for r in df.itertuples()}
    assert rates == {("base", "evaluation"): 0.25, ("base", "training"): 0.0, ("sft", "evaluation"): 0.75,
                     ("grpo-a", "evaluation"): 0.75, ("grpo-a", "training"): 0.5, ("grpo-b", "evaluation"): 1.0,
                     ("grpo-b", "training"): 0.75, ("teacher-scripted", "teacher"): 1.0,
                     ("unregistered", "evaluation"): 0.0}
    assert df.set_index("policy_version_id")["parent"].to_dict()["grpo-b"] == "grpo-a"
    assert (df["ci_low"] <= df["success_rate"]).all() and (df["success_rate"] <= df["ci_high"]).all()
    with open_store(url, settings=Settings(home=home)) as st:  # the window applies: nothing started in 2001
        from datetime import datetime, timezone
        old = Window(until=datetime(2001, 1, 1, tzinfo=timezone.utc))
        assert success_along_chain(st, old).empty


def test_the_overview_draws_the_chain_with_evaluation_and_training_apart(chain_store, monkeypatch):
    url, home = chain_store
    monkeypatch.setenv("OPENFORGE_STORE_URL", url)
    monkeypatch.setenv("OPENFORGE_HOME", str(home))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    assert "Success rate along the policy chain" in [s.value for s in at.subheader]
    table = at.dataframe[0].value
    assert list(dict.fromkeys(table["policy_version_id"])) == CHAIN
    evaluation = table[table["purpose"] == "evaluation"]
    assert evaluation["success_rate"].tolist() == [0.25, 0.75, 0.75, 1.0, 0.0]
    assert table[table["purpose"] == "training"]["policy_version_id"].tolist() == ["base", "grpo-a", "grpo-b"]
    (spec,) = chain_specs(at)
    x = spec["layer"][0]["encoding"]["x"]
    assert x["field"] == "policy_version_id" and x["sort"] == CHAIN
    assert spec["layer"][0]["encoding"]["color"]["field"] == "purpose"


def test_a_chain_without_graded_rollouts_says_so(tmp_path, monkeypatch):
    url, home = f"sqlite:///{tmp_path / 's.sqlite'}", tmp_path / "home"
    with open_store(url, settings=Settings(home=home)) as st:
        st.register_policy_version("base", model_name="smollm2")
        st.start_rollout("r1", policy_version_id="base", metadata={"purpose": "eval"})
        st.finish_rollout("r1", "infra_error")
    monkeypatch.setenv("OPENFORGE_STORE_URL", url)
    monkeypatch.setenv("OPENFORGE_HOME", str(home))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    assert any("No graded rollout" in c.value for c in at.caption)
    assert not chain_specs(at)
