"""The Streamlit dashboard driven by AppTest on seeded stores: every page, and every bad store shows a message."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from streamlit.testing.v1 import AppTest

from forge_store import Settings, Window, open_store
from forge_store import _migrate as migrate
from forge_store._engine import create_engine
from forge_store.testing import Turn, agent_calls, seed_demo_store

APP = str(Path(__file__).resolve().parent.parent / "dashboards" / "app.py")


def _app(monkeypatch, url: str, home: Path) -> AppTest:
    monkeypatch.setenv("OPENFORGE_STORE_URL", url)
    monkeypatch.setenv("OPENFORGE_HOME", str(home))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    return at


def _texts(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "info", "warning", "error", "success", "header",
                                  "subheader", "text", "code") for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


@pytest.fixture
def seeded(store_url, tmp_path):
    home = tmp_path / "home"
    with open_store(store_url, settings=Settings(home=home)) as st:
        seed_demo_store(st, n_tasks=3, per_task=4)
    return store_url, home


def test_every_page_on_a_seeded_store(seeded, monkeypatch):
    url, home = seeded
    at = _app(monkeypatch, url, home)
    assert not at.exception, at.exception
    assert "Overview" in _texts(at) and at.metric[0].value == "24"  # 3 tasks x 2 policies x 4 (one infra error)
    assert "infra_error" in str(at.dataframe[-1].value)

    at.sidebar.radio(key="page").set_value("Trajectories").run()
    assert not at.exception, at.exception
    assert "24 rollouts match" in _texts(at)
    at.selectbox(key="f_outcome").set_value("success").run()
    assert "rollouts match" in _texts(at) and not at.exception
    at.selectbox(key="f_outcome").set_value("(any)").run()
    at.selectbox(key="rollout_id").set_value("r-0-0-0").run()
    text = _texts(at)
    assert "Rollout r-0-0-0" in text and "sha256:abab" in text and "policy-v1" in text and "react" in text
    assert not at.warning, [w.value for w in at.warning]  # its screenshot is in the blob store
    assert at.metric[1].label == "Reward" and at.metric[1].value in ("0", "1")
    at.sidebar.multiselect(key="reward_sources").set_value(["judge"]).run()  # the demo's rewards are the verifier's
    assert at.metric[1].value == "none" and not at.exception
    assert at.dataframe[0].value["reward"].isna().all()
    at.sidebar.multiselect(key="reward_sources").set_value([]).run()
    at.number_input(key="step").set_value(2).run()
    text = _texts(at)
    assert "read_file" in text and "src/app.py" in text and not at.exception

    at.sidebar.radio(key="page").set_value("Behaviour").run()
    assert not at.exception, at.exception
    assert "pass@k" in _texts(at) and len(at.dataframe) == 2
    at.radio(key="side").set_value("harness").run()
    assert not at.exception, at.exception

    at.sidebar.radio(key="page").set_value("Exports").run()
    assert not at.exception and "export-demo" in _texts(at)


def test_missing_screenshot_is_a_warning(seeded, monkeypatch):
    url, home = seeded
    blob = next(p for p in (home / "blobs").rglob("*") if p.is_file())
    blob.unlink()
    at = _app(monkeypatch, url, home)
    at.sidebar.radio(key="page").set_value("Trajectories").run()
    at.selectbox(key="rollout_id").set_value("r-0-0-0").run()
    assert not at.exception, at.exception
    assert any("cannot be shown" in w.value for w in at.warning)


def test_empty_database_is_an_info_and_stays_empty(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'empty.sqlite'}"
    at = _app(monkeypatch, url, tmp_path / "home")
    assert not at.exception and "no tables yet" in at.info[0].value
    assert "openforge db upgrade" in at.info[0].value
    assert migrate.current(create_engine(url)) is None  # read-only: the dashboard created nothing


def test_store_without_rollouts_and_without_exports(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    open_store(url, settings=Settings(home=tmp_path / "home")).close()
    at = _app(monkeypatch, url, tmp_path / "home")
    assert not at.exception and "no rollouts yet" in at.info[0].value
    at.sidebar.radio(key="page").set_value("Exports").run()
    assert "No exports yet" in at.info[0].value


def test_old_migration_is_a_warning(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = create_engine(url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0001'"))
    engine.dispose()
    monkeypatch.setattr(migrate, "heads", lambda: ("9999",))
    monkeypatch.setattr(migrate, "known_revisions", lambda: {"0001", "9999"})
    at = _app(monkeypatch, url, tmp_path / "home")
    assert not at.exception and "openforge db upgrade" in at.warning[0].value


def test_behaviour_rubrics_are_those_of_analyze(seeded):
    """The Behaviour page's rubrics come from the same code as ``openforge analyze``: same numbers, same slices."""
    from dashboards._context import Context
    from dashboards._queries import RUBRICS
    from dashboards._views.behaviour import compare
    from learner import analyze

    url, home = seeded
    with open_store(url, settings=Settings(home=home)) as st:
        page = compare(Context(store=st, window=Window()), "policy_version_id", "policy-v1", "policy-v2", sample=100)
        rows = {r["policy_version"]: r for r in analyze(st)["behaviour"]}
    for pv in ("policy-v1", "policy-v2"):
        shown = page["rubrics"][pv].to_dict()
        assert shown == pytest.approx({k: rows[pv][k] for k in RUBRICS}), pv


def test_no_successful_rollout_means_no_step_efficiency_anywhere(tmp_path, monkeypatch):
    """Step efficiency is over rollouts that passed: with none, the dashboard and ``openforge analyze`` show none."""
    from learner import analyze

    url, home = f"sqlite:///{tmp_path / 's.sqlite'}", tmp_path / "home"
    with open_store(url, settings=Settings(home=home)) as st:
        st.register_task("t", metadata={"reference_steps": 2})
        for i in range(3):
            st.start_rollout(f"r{i}", task_id="t", policy_version_id="p")
            for rec in agent_calls(f"r{i}", [Turn([("bash", {"command": "ls"})], ["ok"]), Turn(text="gave up")],
                                   policy_version_id="p"):
                st.record_call(rec)
            st.finish_rollout(f"r{i}", "failure")
            st.add_reward(f"r{i}", 0.0)
        assert analyze(st)["behaviour"][0]["step_efficiency"] is None
    at = _app(monkeypatch, url, home)
    at.sidebar.radio(key="page").set_value("Behaviour").run()
    assert not at.exception, at.exception
    rubrics = at.dataframe[-1].value
    assert "step_efficiency" in rubrics.index and rubrics.loc["step_efficiency"].isna().all()
    assert rubrics.loc["tool_coverage"].isna().all() and rubrics.loc["rollouts"].eq(3).all()


def test_mismatch_page_shows_the_rescores(seeded, monkeypatch):
    from forge_store import RescoreRow, record_rescores

    url, home = seeded
    at = _app(monkeypatch, url, home)
    at.sidebar.radio(key="page").set_value("Mismatch").run()
    assert not at.exception and "No re-scores yet" in at.info[0].value
    with open_store(url, settings=Settings(home=home)) as st:
        ids = [r.id for r in st.iter_rollouts()][:4]
        calls = [c for cs in st.token_calls(ids).values() for c in cs if c.logprobs]
        versions = sorted({c.policy_version_id for c in calls if c.policy_version_id})
        assert calls and versions
        rows = [RescoreRow(c.id, c.rollout_id, c.policy_version_id, "hf-float32", None, c.completion_logprobs)
                for c in calls if c.policy_version_id]
        rows += [RescoreRow(c.id, c.rollout_id, "other", "hf-float32", None, [x - 0.3 for x in c.completion_logprobs])
                 for c in calls]
        st.register_policy_version("other", model_name="m", global_step=9)
        assert record_rescores(st, rows) == len(rows)
    at.run()
    assert not at.exception, at.exception
    assert "ratio mean 1.00000 (within [0.99, 1.01])" in at.success[0].value
    by_version = at.dataframe[0].value
    other = by_version[by_version["rescored_under"] == "other"].iloc[0]
    assert other["rescored_step"] == 9 and other["mismatch_mean"] == pytest.approx(0.3, abs=1e-5)
    assert len(at.dataframe[1].value) >= len(ids)
