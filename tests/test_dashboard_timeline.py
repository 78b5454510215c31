"""The Timeline and Search pages and the Overview's day chart (issue 33), driven by AppTest on real stores: a 40-turn
rollout with a compaction and a sub-agent (segment boundaries with their reasons), rewards from two sources and an
exclusion, deep links, a search that finds a planted command, and a store whose rollouts are all from one day."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from forge_store import Settings, open_store
from forge_store.testing import T0, Turn, agent_calls, seed_demo_store

APP = str(Path(__file__).resolve().parent.parent / "dashboards" / "app.py")
PLANTED = "rm -rf /var/lib/app/cache"


def _texts(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "info", "warning", "error", "success", "header",
                                  "subheader", "text", "code") for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts) + "\n" + "\n".join(e.label for e in at.expander)


def _app(monkeypatch, url: str, home: Path, **params: str) -> AppTest:
    monkeypatch.setenv("OPENFORGE_STORE_URL", url)
    monkeypatch.setenv("OPENFORGE_HOME", str(home))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(params)
    at.run()
    assert not at.exception, at.exception
    return at


def record_long_rollout(st, rid: str = "r-long", turns: int = 40) -> list[str]:
    """``turns`` calls: a first segment, a compacted history (a summary replaces it), then a sub-agent (another
    system prompt); a planted command in the middle; rewards from the verifier and a judge; an exclusion."""
    st.start_rollout(rid, task_id="task-0", policy_version_id="policy-v2", started_at=T0)
    third = turns // 3
    first = [Turn([("bash", {"command": f"ls step{i}"})], [f"step{i}.txt"]) for i in range(third)]
    first[third // 2] = Turn([("bash", {"command": PLANTED})], [""])
    after = [Turn([("read_file", {"path": f"src/m{i}.py"})], [f"x = {i}"]) for i in range(third)]
    sub = [Turn([("bash", {"command": f"pytest -k t{i}"})], ["1 passed"]) for i in range(turns - 2 * third - 1)]
    sub.append(Turn(text="All done."))
    records = agent_calls(rid, first, started_at=T0)
    summary = agent_calls(rid, after, started_at=T0 + timedelta(minutes=5),
                          instruction="Summary of the work so far: listed files, cleaned the cache. Continue.")
    sub_agent = agent_calls(rid, sub, started_at=T0 + timedelta(minutes=10), instruction="Run the tests.")
    sub_agent = [dataclasses.replace(r, messages=[{"role": "system", "content": "You are a test-running sub-agent."},
                                                  *r.messages[1:]]) for r in sub_agent]
    ids = []
    for n, rec in enumerate([*records, *summary, *sub_agent]):
        rec = dataclasses.replace(rec, id=f"{rid}-s{n:03d}", seq=n)
        st.record_call(rec)
        ids.append(rec.id)
    st.finish_rollout(rid, "success", ended_at=T0 + timedelta(minutes=20))
    st.add_reward(rid, 1.0, verifier_version="v1")
    st.add_reward(rid, 0.5, source="judge", verifier_version="rubric-1")
    st.add_exclusion("filtered", rollout_id=rid, detail={"why": "test"})
    return ids


@pytest.fixture
def seeded(store_url, tmp_path):
    home = tmp_path / "home"
    with open_store(store_url, settings=Settings(home=home)) as st:
        seed_demo_store(st, n_tasks=2, per_task=3)
        ids = record_long_rollout(st)
    return store_url, home, ids


def test_timeline_of_a_40_turn_rollout(seeded, monkeypatch):
    url, home, ids = seeded
    at = _app(monkeypatch, url, home, page="Timeline", rollout="r-long", step="14")
    text = _texts(at)
    assert "Rollout r-long" in text and at.metric[1].value == "40" and at.metric[2].value == "3"
    assert "compaction: the history shrank" in text and "another system prompt" in text
    assert "Segment 2 starts at step 14" in text  # the window holds the linked step
    assert "Step 14 · read_file" in text
    assert "judge" in str(at.dataframe[0].value) and "verifier" in str(at.dataframe[0].value)
    assert "filtered" in text
    segs = at.dataframe[1].value
    assert list(segs["first step"]) == [1, 14, 27] and segs["started because"].str.contains("compaction").any()
    assert len(at.dataframe[2].value) == 40  # the step index covers every step
    assert "src/m1.py" not in text  # step 15 is collapsed: its content is written once it is opened
    at.session_state["tl_open_r-long_14_15"] = True
    at.run()
    assert not at.exception and "src/m1.py" in _texts(at) and "Step 14 · read_file" in _texts(at)
    at.number_input(key="tl_step").set_value(7).run()
    assert not at.exception and PLANTED in _texts(at)  # step 7's tool call, with the window moved back
    assert at.query_params["step"] == ["7"] or at.query_params["step"] == "7"


def test_timeline_links_from_a_call_and_shows_a_gui_step(seeded, monkeypatch):
    url, home, ids = seeded
    at = _app(monkeypatch, url, home, page="Timeline", rollout="r-0-0-0")
    text = _texts(at)
    assert "Rollout r-0-0-0" in text and "Screen and action" in text and not at.warning  # the demo's screenshot, drawn
    at = _app(monkeypatch, url, home, page="Timeline", rollout="r-long", call=ids[30])
    assert at.number_input(key="tl_step").value == 31


def test_search_page_finds_a_planted_command(seeded, monkeypatch):
    url, home, ids = seeded
    at = _app(monkeypatch, url, home, page="Search", q="RM -RF /var")
    hits = at.dataframe[0].value
    assert list(hits["rollout"]) == ["r-long"] and "[[rm -rf /var]]" in hits["snippet"].iloc[0]
    assert hits["open"].iloc[0] == f"?page=Timeline&rollout=r-long&call={ids[6]}"
    at.text_input(key="search_q").set_value("pytest -q").run()
    assert not at.exception and "Calls holding 'pytest -q'" in _texts(at)
    at.selectbox(key="s_pv").set_value("policy-v1").run()
    assert set(at.dataframe[0].value["version"]) == {"policy-v1"}
    at.text_input(key="search_q").set_value("rm").run()
    assert "at least 3 characters" in _texts(at)


def test_the_day_chart_shows_a_single_day(tmp_path, monkeypatch):
    url, home = f"sqlite:///{tmp_path / 'one-day.sqlite'}", tmp_path / "home"
    with open_store(url, settings=Settings(home=home)) as st:
        seed_demo_store(st, n_tasks=1, per_task=2, policies=("policy-v1",))
    at = _app(monkeypatch, url, home)
    assert "Every rollout in this window started on 2026-01-01" in _texts(at)
    specs = [json.loads(chart.proto.spec) for chart in at.get("vega_lite_chart")]
    day = [s for s in specs if s.get("encoding", {}).get("x", {}).get("field") == "day"]
    assert len(day) == 1 and day[0]["mark"]["point"]  # a line with a point on its one day: visible


def test_group_page_puts_a_grpo_group_side_by_side(seeded, monkeypatch):
    url, home, _ = seeded
    at = _app(monkeypatch, url, home, page="Group", group="g-0-policy-v1")
    rows = at.dataframe[0].value
    assert sorted(rows["rollout"]) == ["r-0-0-0", "r-0-0-1", "r-0-0-2"]
    assert rows.loc[rows["rollout"] == "r-0-0-2", "reward"].isna().all()  # the infra error: no reward, no advantage
    graded = rows.dropna(subset=["reward"])
    assert abs(graded["advantage"].sum()) < 1e-9 and graded["advantage"].notna().all()  # GRPO: centred on the mean
    actions = at.dataframe[1].value
    assert set(actions.columns) == {"action", "r-0-0-0", "r-0-0-1", "r-0-0-2"}
    assert actions.iloc[0, 1:].nunique() == 1 and actions.iloc[1, 1:].nunique() == 1  # ls, then read_file: all alike
    text = _texts(at)
    assert "Group g-0-policy-v1" in text and ("diverge at action" in text or "same actions" in text)
    if "diverge at action" in text:
        k = int(text.split("diverge at action ")[1].split(".")[0])
        assert k >= 3 and actions.iloc[k - 1, 1:].nunique() > 1
    at = _app(monkeypatch, url, home, page="Group")  # no link: the newest rollout's group
    assert at.text_input(key="group_id").value.startswith("g-")


def test_versions_page_shows_one_task_along_the_chain(seeded, monkeypatch):
    url, home, _ = seeded
    at = _app(monkeypatch, url, home, page="Versions", task="task-1")
    rows = at.dataframe[0].value
    assert list(rows["policy version"]) == ["policy-v1", "policy-v2"]  # parent (step 100) before child (step 200)
    assert list(rows["rollouts"]) == [3, 3] and rows["tool calls per rollout"].min() >= 3
    assert rows["newest"].str.startswith("?page=Timeline&rollout=r-1-").all()
    assert "Task task-1 under each policy version" in _texts(at).replace("`", "")


def _chart_data(chart) -> "pd.DataFrame":
    import pyarrow as pa

    return pa.ipc.open_stream(chart.proto.datasets[0].data.data).read_pandas()


def test_a_long_rollout_draws_coarse_timing_and_the_window_call_by_call(store_url, tmp_path, monkeypatch):
    """A rollout past DETAIL_MAX steps: the browser draws a bounded chart (bars per group of steps, the window's
    highlighted) and the window's calls one by one; the step index still holds every call's timing."""
    from dashboards._timeline import build
    from dashboards._views.timeline import BINS, DETAIL_MAX

    home, turns = tmp_path / "home", 2 * DETAIL_MAX + 50
    with open_store(store_url, settings=Settings(home=home)) as st:
        record_long_rollout(st, "r-many", turns=turns)
        steps = build(st.timeline("r-many"))
    at = _app(monkeypatch, store_url, home, page="Timeline", rollout="r-many", step="150")
    text = _texts(at)
    assert "Steps 145-164 of 250" in text and "Step 150 · " in text and "Timing of steps 145-164" in text
    coarse, detail = (_chart_data(c) for c in at.get("vega_lite_chart"))
    assert len(coarse) <= 3 * BINS and coarse["calls"].sum() == 3 * turns  # every call in one group (x 3 kinds)
    spent = sum(s.call.latency_ms / 1000 + (s.tool_s or 0) for s in steps)
    assert abs(coarse["seconds"].sum() - spent) < 0.01 * spent
    lit = coarse[coarse["in_window"]]
    assert lit["first_step"].min() <= 145 and (lit["first_step"] + lit["calls"] - 1).max() >= 164
    assert not coarse[~coarse["in_window"]]["first_step"].between(145, 164).any()
    assert set(detail["step"]) == set(range(145, 165))  # the window's calls, every kind on the rollout's time axis
    assert detail["start_s"].min() > 0
    index = at.dataframe[2].value
    assert len(index) == turns and index["latency_s"].notna().all() and "ttft_s" in index
