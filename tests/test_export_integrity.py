"""Exports that cannot bias GRPO or leak a secret: filters keep whole groups, excluded rollouts keep their true
reason, logprob mismatches and redacted calls are exclusions, and ``verify`` names missing, extra and changed rows."""

from __future__ import annotations

import pandas as pd
import pytest
import sqlalchemy as sa
import typer
from typer.testing import CliRunner

from forge_store import open_store
from forge_store._tokens import pack_logprobs
from learner._cli import export_app
from learner._export import export, verify
from learner._plan import ExportConfig, ExportError
from tests.conftest import make_call
from tests.test_learner_export import _rollout, _seed

README_WHERE = "outcome = 'success' or reward > 0"
app = typer.Typer()
app.add_typer(export_app, name="export")


@pytest.fixture
def store(store_url, settings):
    st = open_store(store_url, settings=settings)
    yield st
    st.close()


def _mixed(st):
    """g1: 2 successes, 2 failures and an infra error; g2: all failures; g3: all successes."""
    st.register_task("t1")
    st.register_policy_version("p1", model_name="m")
    for g in ("g1", "g2", "g3"):
        st.create_group(g, task_id="t1", target_size=4, policy_version_id="p1")
    for rid, g, r in (("a1", "g1", 1.0), ("a2", "g1", 1.0), ("a3", "g1", 0.0), ("a4", "g1", 0.0),
                      ("b1", "g2", 0.0), ("b2", "g2", 0.0), ("b3", "g2", 0.0), ("b4", "g2", 0.0),
                      ("c1", "g3", 1.0), ("c2", "g3", 1.0), ("c3", "g3", 1.0), ("c4", "g3", 1.0)):
        _rollout(st, rid, g, r, outcome="success" if r else "failure")
    _rollout(st, "a5", "g1", None, outcome="infra_error")


def _adv(path) -> dict[str, float]:
    df = pd.read_parquet(path / "trajectories-00000.parquet")
    return dict(zip(df["rollout_id"], df["advantage"]))


def test_a_where_that_splits_groups_is_refused_with_the_fix(store, tmp_path):
    _mixed(store)
    with pytest.raises(ExportError) as exc:
        export(store, tmp_path / "x", ExportConfig(format="verl", where=README_WHERE))
    msg = str(exc.value)
    assert "removed 2 of 4 rollouts from 1 group(s) (g1)" in msg  # the infra error is not the filter's
    assert "--group-where" in msg and "--allow-partial-groups" in msg
    assert not any((tmp_path / "x").iterdir())  # refused before anything was written
    # SFT has no groups: the same filter takes rollouts one by one
    m = export(store, tmp_path / "sft", ExportConfig(format="sft", where=README_WHERE))
    assert m["exclusions"] == {"filtered": 6, "infra_error": 1}


def test_group_where_keeps_whole_groups_and_their_advantages(store, tmp_path):
    _mixed(store)
    whole = export(store, tmp_path / "all", ExportConfig(format="verl"))
    m = export(store, tmp_path / "x", ExportConfig(format="verl", group_where=README_WHERE))
    assert m["exclusions"] == {"filtered": 4, "infra_error": 1}  # g2 whole; a5 keeps its true reason
    adv = _adv(tmp_path / "x")
    assert sorted(adv) == ["a1", "a2", "a3", "a4", "c1", "c2", "c3", "c4"]
    assert adv["a1"] > 0 > adv["a3"] and adv == {k: v for k, v in _adv(tmp_path / "all").items() if k in adv}
    assert whole["exclusions"] == {"infra_error": 1}


def test_partial_groups_on_request_keep_the_whole_group_baseline(store, tmp_path):
    _mixed(store)
    export(store, tmp_path / "all", ExportConfig(format="verl"))
    whole = _adv(tmp_path / "all")
    for size in (None, 2):
        out = tmp_path / f"p{size}"
        m = export(store, out, ExportConfig(format="verl", where=README_WHERE, allow_partial_groups=True,
                                            min_group_size=size))
        assert m["exclusions"] == {"filtered": 6, "infra_error": 1}
        adv = _adv(out)
        assert sorted(adv) == ["a1", "a2", "c1", "c2", "c3", "c4"]
        assert adv == {k: whole[k] for k in adv} and adv["a1"] > 0  # over all four of g1, not over its successes


def test_an_excluded_rollout_keeps_its_first_true_reason(store, tmp_path):
    _mixed(store)
    m = export(store, tmp_path / "x", ExportConfig(format="verl", where="outcome = 'success'",
                                                   allow_partial_groups=True))
    with store.engine.connect() as conn:
        reason = conn.execute(sa.text("select reason from exclusions where rollout_id = 'a5' and export_id = :e"),
                              {"e": m["export_id"]}).scalar_one()
    assert reason == "infra_error"


def test_the_readme_export_example_runs(tmp_path, settings):
    """README: `openforge export --format verl ... --group-where "reward > 0"` and the SFT --where line."""
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    with open_store(url, settings=settings) as st:
        _mixed(st)
    run = CliRunner().invoke
    r = run(app, ["export", "--format", "verl", "--where", README_WHERE, "--store", url, "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "--group-where" in r.output
    r = run(app, ["export", "--format", "verl", "--group-where", "reward > 0", "--store", url,
                  "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert '"filtered": 4' in r.output and "in 2 groups" in r.output
    r = run(app, ["export", "--format", "sft", "--where", "outcome = 'success'", "--store", url,
                  "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output


def test_a_logprob_count_mismatch_is_an_exclusion_with_the_counts(store, tmp_path):
    store.register_task("t1")
    store.create_group("g", task_id="t1", target_size=1)
    store.start_rollout("r1", group_id="g", task_id="t1")
    dropped = make_call("r1-c0", "r1", 0, prompt_ids=[1, 2], completion_ids=[5, 6, 7],
                        metadata={"logprob_mismatch": {"logprobs": 2, "completion_tokens": 3}})
    dropped.completion_logprobs = None  # the recorder dropped them, and said so
    store.record_call(dropped)
    store.record_call(make_call("r1-c1", "r1", 1, prompt_ids=[1, 2, 5, 6, 7, 8], completion_ids=[9]))
    store.record_call(make_call("r1-c2", "r1", 2, prompt_ids=[1, 2, 5, 6, 7, 8, 9, 4], completion_ids=[3, 3]))
    with store.engine.begin() as conn:  # a store an older writer filled: one logprob for two tokens
        conn.execute(sa.text("update calls set completion_logprobs = :b where id = 'r1-c2'"),
                     {"b": pack_logprobs([-0.5])})
    store.finish_rollout("r1", "success")
    store.add_reward("r1", 1.0)
    m = export(store, tmp_path / "x", ExportConfig(format="trl"))
    assert m["exclusions"] == {"logprob_mismatch": 2}
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("select call_id, detail from exclusions where reason = 'logprob_mismatch' "
                                    "order by call_id")).all()
    details = {cid: (d if isinstance(d, dict) else __import__("json").loads(d)) for cid, d in rows}
    assert details == {"r1-c0": {"logprobs": 2, "completion_tokens": 3},
                       "r1-c2": {"logprobs": 1, "completion_tokens": 2}}
    df = pd.read_parquet(tmp_path / "x" / "samples-00000.parquet")
    assert len(df) == 1 and list(df["call_ids"][0]) == ["r1-c1"]  # only r1-c1's completion is trained on
    assert list(df["prompt_ids"][0]) == [1, 2, 5, 6, 7, 8] and list(df["env_mask"][0]) == [1]
    assert export(store, tmp_path / "sft", ExportConfig(format="sft"))["exclusions"] == {}  # text needs no logprobs


def test_redacted_calls_are_excluded_by_default(store, tmp_path, settings, store_url):
    store.register_task("t1")
    store.create_group("g", task_id="t1", target_size=2)
    for rid, reward, meta in (("r1", 1.0, {"redacted": ["api_keys"]}), ("r2", 0.0, None)):
        store.start_rollout(rid, group_id="g", task_id="t1")
        store.record_call(make_call(f"{rid}-c0", rid, 0, metadata=meta))  # as the proxy records a redacted call
        store.finish_rollout(rid, "success" if reward else "failure")
        store.add_reward(rid, reward)
    for fmt in ("verl", "sft"):
        m = export(store, tmp_path / fmt, ExportConfig(format=fmt))
        assert m["exclusions"] == {"redacted": 1}
    with store.engine.connect() as conn:
        detail = conn.execute(sa.text("select detail from exclusions where reason = 'redacted' limit 1")).scalar_one()
    assert "api_keys" in str(detail) and "r1-c0" in str(detail) and "--include-redacted" in str(detail)
    adv = _adv(tmp_path / "verl")
    assert list(adv) == ["r2"] and adv["r2"] < 0  # r1 still counts in the group's baseline
    m = export(store, tmp_path / "kept", ExportConfig(format="verl", include_redacted=True))
    assert m["exclusions"] == {} and sorted(_adv(tmp_path / "kept")) == ["r1", "r2"]
    r = CliRunner().invoke(app, ["export", "--include-redacted", "--store", store_url, "--out", str(tmp_path / "cli")])
    assert r.exit_code == 0 and '"redacted"' not in r.output, r.output


def test_verify_matches_rows_by_key_and_names_what_changed(store, tmp_path):
    _seed(store)
    m = export(store, tmp_path / "x", ExportConfig(format="verl"))
    with store.engine.begin() as conn:
        conn.execute(sa.text("update rollouts set group_id = 'g2' where id = 'd2'"))  # g4 breaks up, g2 completes
        conn.execute(sa.text("update rewards set value = 0.25 where rollout_id = 'a1'"))
    res = verify(tmp_path / "x" / "manifest.json", store)
    assert not res["ok"] and res["export_id"] == m["export_id"]
    (rows,) = [p for p in res["problems"] if p.startswith("trajectories-*.parquet")]
    assert rows.endswith("the rows differ: 2 missing from the files (group g2), 2 extra in the files (group g4), "
                         "3 changed: advantage, reward_score (first: g1_a1_0)"), rows
    (prompts,) = [p for p in res["problems"] if p.startswith("rl_prompts-*.parquet")]
    assert "1 missing from the files (group g2), 1 extra in the files (group g4)" in prompts
    shard = tmp_path / "x" / "trajectories-00000.parquet"  # a file changed on disk: its rows are compared too
    with store.engine.begin() as conn:
        conn.execute(sa.text("update rollouts set group_id = 'g4' where id = 'd2'"))
        conn.execute(sa.text("update rewards set value = 1.0 where rollout_id = 'a1'"))
    assert verify(tmp_path / "x" / "manifest.json", store)["ok"]
    import pyarrow.parquet as pq

    table = pq.read_table(shard)
    pq.write_table(table.slice(0, table.num_rows - 1), shard)
    problems = verify(tmp_path / "x" / "manifest.json", store)["problems"]
    assert "file changed on disk" in problems[0]
    assert "1 missing from the files (group g4), 0 extra in the files, 0 changed" in problems[1]
