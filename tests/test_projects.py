"""Two projects in one PostgreSQL database (a schema each, picked by ``?project=`` in the store URL): every read,
the admin API of a project's proxy, an export, the DuckDB views and the dashboard of project A show nothing of
project B."""

from __future__ import annotations

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from forge_store import NotFound, Settings, StoreURLError, connect_duckdb, erase, open_store, Selection
from learner import ExportConfig, export
from tests.proxy_fixtures import make_proxy
from tests.test_dashboard import APP, _texts


def _b(url: str, tmp_path) -> None:
    """Project B: a task, a group of two rollouts with calls and rewards, written through the store."""
    from tests.conftest import make_call

    with open_store(url, settings=Settings(home=tmp_path / "home-b")) as st:
        st.register_task("task-b")
        st.create_group("group-b", task_id="task-b", target_size=2)
        for rid in ("rb-1", "rb-2"):
            st.start_rollout(rid, group_id="group-b", task_id="task-b")
            st.record_call(make_call(f"{rid}-c", rid, 0))
            st.finish_rollout(rid, "success")
            st.add_reward(rid, 1.0 if rid == "rb-1" else 0.0)


def test_two_projects_in_one_database_see_nothing_of_each_other(pg_database, up, tmp_path, monkeypatch):
    a_url, b_url = f"{pg_database}?project=team_a", f"{pg_database}?project=team_b"
    _b(b_url, tmp_path)
    px, serve = make_proxy(up, tmp_path, store_url=a_url)   # project A records through its own proxy
    try:
        st = px.store
        st.register_task("task-a")
        st.create_group("group-a", task_id="task-a", target_size=2)
        for rid in ("ra-1", "ra-2"):
            client = px.client(px.register(rid, group_id="group-a", task_id="task-a"))
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"hello {rid}"}])
            px.end(rid, "success")
            st.add_reward(rid, 1.0 if rid == "ra-1" else 0.0)
        assert st.flush(30)
        # the admin API of A's proxy, with A's token: B's rollout is unknown there
        r = px.admin("POST", "/admin/rollouts/rb-1/rewards", json={"value": 1.0})
        assert r.status_code == 404, r.text
        a_token = px.proxy.admin_token
    finally:
        serve.stop()
        px.store.close()
    b_home = tmp_path / "b-proxy"
    b_home.mkdir()
    pb, serve_b = make_proxy(up, b_home, store_url=b_url)   # B's proxy refuses A's admin token
    try:
        r = httpx.get(pb.url + "/admin/status", headers={"Authorization": f"Bearer {a_token}"}, timeout=30)
        assert r.status_code == 401
    finally:
        serve_b.stop()
        pb.store.close()

    a = open_store(a_url, settings=Settings(home=tmp_path / "proxy-home"))
    b = open_store(b_url, settings=Settings(home=tmp_path / "home-b"))
    try:
        assert sorted(i.id for i in a.iter_rollouts()) == ["ra-1", "ra-2"]
        assert sorted(i.id for i in b.iter_rollouts()) == ["rb-1", "rb-2"]
        with pytest.raises(NotFound):
            a.rollout("rb-1")
        assert a.calls("rb-1") == [] and a.latest_rewards(["rb-1", "rb-2"]) == {}
        assert [t["id"] for t in a.lineage("tasks")] == ["task-a"]
        assert {g for g, *_ in a.group_index()} == {"group-a"}
        assert a.store_id != b.store_id and a.counts()["calls"] == 2 and b.counts()["calls"] == 2
        m = export(a, tmp_path / "export-a", ExportConfig(format="verl"))
        assert m["counts"]["rollouts_seen"] == 2 and m["counts"]["rollouts_exported"] == 2
        con = connect_duckdb(a_url)
        assert sorted(r[0] for r in con.sql("select id from rollouts").fetchall()) == ["ra-1", "ra-2"]
        assert con.sql("select count(*) from calls").fetchone()[0] == 2
        # an erasure in A cannot reach B
        erase(a, Selection(tasks=("task-b",)), reason="x", apply=True)
        assert b.counts()["rollouts"] == 2
    finally:
        a.close()
        b.close()
    monkeypatch.setenv("OPENFORGE_STORE_URL", a_url)
    monkeypatch.setenv("OPENFORGE_HOME", str(tmp_path / "proxy-home"))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    assert at.metric[0].value == "2"   # rollouts on the Overview: A's two, none of B's
    at.sidebar.radio(key="page").set_value("Trajectories").run()
    assert "2 rollouts match" in _texts(at) and "rb-1" not in _texts(at)


def test_a_project_is_refused_where_it_cannot_be(tmp_path, pg_database):
    with pytest.raises(StoreURLError, match="needs PostgreSQL"):
        open_store(f"sqlite:///{tmp_path / 's.sqlite'}?project=team_a")
    with pytest.raises(StoreURLError, match="not a valid name"):
        open_store(f"{pg_database}?project=Team-A")
