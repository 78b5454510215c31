"""Learner on real SQLite and PostgreSQL: reconstruction, GRPO numbers, exclusions, byte-identical exports, verify."""

from __future__ import annotations

import math

import duckdb
import pandas as pd
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from forge_store import open_store
from learner._export import export, verify
from learner._grpo import GrpoConfig, group_advantages, policy_lag, policy_order
from learner._plan import ExportConfig
from learner._query import QueryError, parse_where
from learner._reconstruct import reconstruct, reconstruct_rollout
from tests.conftest import make_call


@pytest.fixture
def store(store_url, settings):
    st = open_store(store_url, settings=settings)
    yield st
    st.close()


def _chain(st, rid, turns=3, start_seq=0, base=None, **kw):
    """Append-only calls: each prompt = previous prompt + completion + 2 new tokens."""
    prompt = list(base or [1, 2, 3])
    for t in range(turns):
        comp = [100 + 10 * t + start_seq, 101 + 10 * t + start_seq]
        st.record_call(make_call(f"{rid}-c{start_seq + t}", rid, start_seq + t, prompt_ids=prompt, completion_ids=comp, **kw))
        prompt = prompt + comp + [50 + t, 60 + t]
    return prompt


def _rollout(st, rid, gid, reward=None, outcome="success", task="t1", pv="p1", turns=2):
    st.start_rollout(rid, group_id=gid, task_id=task, policy_version_id=pv, harness_id="h@1", image_digest="sha256:img")
    _chain(st, rid, turns)
    st.finish_rollout(rid, outcome)
    if reward is not None:
        st.add_reward(rid, reward, verifier_version="v1")


def test_pure_append_chain_is_one_segment(store):
    store.start_rollout("r1")
    _chain(store, "r1", 3)
    calls = store.calls("r1")
    rec = reconstruct_rollout(calls)
    assert len(rec.segments) == 1 and rec.merged == 2 and rec.merge_rate == pytest.approx(2 / 3)
    seg = rec.segments[0]
    assert seg.prompt_ids == [1, 2, 3] and seg.num_turns == 3 and seg.call_ids == ["r1-c0", "r1-c1", "r1-c2"]
    assert seg.response_ids == [100, 101, 50, 60, 110, 111, 51, 61, 120, 121]
    assert seg.response_mask == [1, 1, 0, 0, 1, 1, 0, 0, 1, 1]
    assert seg.response_logprobs == [-0.5, -0.5, 0, 0, -0.5, -0.5, 0, 0, -0.5, -0.5]
    # token by token: the full sequence is the last call's prompt + completion
    assert seg.full_ids() == calls[-1].prompt_token_ids + calls[-1].completion_token_ids


def test_compaction_template_drop_retry_and_multimodal(store):
    store.start_rollout("r1")
    _chain(store, "r1", 2)  # seq 0,1
    # compaction: a summary prompt that does not extend -> new segment
    _chain(store, "r1", 2, start_seq=2, base=[1, 2, 900])
    # template drops earlier reasoning: prompt = previous prompt minus a completion token -> new segment
    prev = store.calls("r1")[-1]
    dropped = prev.prompt_token_ids[:3] + prev.prompt_token_ids[4:] + [77]
    store.record_call(make_call("r1-c4", "r1", 4, prompt_ids=dropped, completion_ids=[5, 6]))
    # a failed call then its retry with the same prompt: the error is excluded, the retry extends
    nxt = dropped + [5, 6, 8]
    err = make_call("r1-c5", "r1", 5, prompt_ids=nxt, completion_ids=[], error_class="upstream_timeout")
    err.completion_logprobs = []
    store.record_call(err)
    store.record_call(make_call("r1-c6", "r1", 6, prompt_ids=nxt, completion_ids=[9], retry_of="r1-c5"))
    # multimodal: image placeholder tokens in the prompt, the image is a blob
    img = store.put_blob(b"\x89PNG fake", "image/png")
    store.record_call(make_call("r1-c7", "r1", 7, prompt_ids=nxt + [9, 32000, 32000, 32000], completion_ids=[11],
                                image_hashes=[img]))
    rec = reconstruct_rollout(store.calls("r1"))
    assert [s.call_ids for s in rec.segments] == [["r1-c0", "r1-c1"], ["r1-c2", "r1-c3"], ["r1-c4", "r1-c6", "r1-c7"]]
    assert [(e.call_id, e.reason) for e in rec.excluded] == [("r1-c5", "infra_error")]
    last = rec.segments[2]
    assert last.response_mask == [1, 1, 0, 1, 0, 0, 0, 1] and last.image_hashes == [img]
    assert last.response_ids == [5, 6, 8, 9, 32000, 32000, 32000, 11]
    assert rec.merged == 4 and rec.n_calls == 8
    for seg in rec.segments:
        assert len(seg.response_ids) == len(seg.response_mask) == len(seg.response_logprobs)
        assert all((lp != 0) == bool(m) for lp, m in zip(seg.response_logprobs, seg.response_mask))


def test_not_token_exact_and_truncated_calls(store):
    store.start_rollout("r1")
    cut = make_call("a", "r1", 0, prompt_ids=[1], completion_ids=[2])
    cut.finish_reason = "length"
    store.record_call(cut)
    hosted = make_call("b", "r1", 1)
    hosted.prompt_token_ids = hosted.completion_token_ids = hosted.completion_logprobs = None
    hosted.token_exact = False
    store.record_call(hosted)
    calls = store.calls("r1")
    assert reconstruct(calls) == []
    assert [e.reason for e in reconstruct_rollout(calls).excluded] == ["truncated", "not_token_exact"]
    assert len(reconstruct(calls, keep_truncated=True)) == 1


def test_grpo_numbers_by_hand():
    res = group_advantages([1.0, 0.0, 0.0, 1.0])
    std = math.sqrt(4 * 0.25 / 3)  # unbiased, like torch.std
    assert res.advantages == pytest.approx([0.5 / (std + 1e-6), -0.5 / (std + 1e-6)] * 1 + [-0.5 / (std + 1e-6), 0.5 / (std + 1e-6)])
    assert group_advantages([1.0, 0.0, 0.0, 1.0], GrpoConfig(norm_by_std=False)).advantages == [0.5, -0.5, -0.5, 0.5]
    eq = group_advantages([0.7, 0.7, 0.7])
    assert eq.advantages == [0.0, 0.0, 0.0] and eq.note == "all_equal"
    one = group_advantages([0.8])
    assert one.advantages == [0.0] and one.note == "singleton"
    assert group_advantages([0.8], GrpoConfig(singleton="verl")).advantages == [pytest.approx(0.8 / (1 + 1e-6))]
    order = policy_order([{"id": "b", "global_step": 20, "ingest_seq": 1}, {"id": "a", "global_step": 10, "ingest_seq": 2}])
    assert order == {"a": 0, "b": 1} and policy_lag(order, "b", ["a", None]) == 1


def test_where_language():
    p = parse_where("outcome in ('success','failure') and not (attempt > 1) or reward >= 0.5")
    assert p({"outcome": "success", "attempt": 1, "reward": None})
    assert not p({"outcome": "infra_error", "attempt": 1, "reward": 0.1})
    assert p({"outcome": None, "attempt": 3, "reward": 0.9})
    assert parse_where("task_id like 'swe-%' and retry_of is null")({"task_id": "swe-1", "retry_of": None})
    assert not parse_where("task_id = 'x'' or 1=1'")({"task_id": "x"})  # quotes are data, not syntax
    for bad in ("outcome = success", "bogus = 1", "outcome =", "started_at > 'yesterday'", ""):
        with pytest.raises(QueryError):
            parse_where(bad)


def _seed(st):
    st.register_task("t1", source="swe-gym", verifier_hash="vh")
    st.register_harness("h", "1")
    st.register_policy_version("p0", model_name="m", global_step=0)
    st.register_policy_version("p1", model_name="m", global_step=10)
    st.create_group("g1", task_id="t1", target_size=3, policy_version_id="p1")
    st.create_group("g2", task_id="t1", target_size=2, policy_version_id="p1")
    st.create_group("g3", task_id="t1", target_size=2, policy_version_id="p0")
    st.create_group("g4", task_id="t1", target_size=2, policy_version_id="p1")
    _rollout(st, "a1", "g1", 1.0)
    _rollout(st, "a2", "g1", 0.0, outcome="failure")
    _rollout(st, "a3", "g1", 0.0, outcome="harness_error")
    st.add_reward("a2", 1.0, source="judge")  # a re-grade: the latest row wins
    _rollout(st, "a4", "g1", None, outcome="infra_error")
    _rollout(st, "b1", "g2", 1.0)
    _rollout(st, "b2", "g2", None)  # no reward -> b1 alone: incomplete group
    _rollout(st, "c1", "g3", 1.0, pv="p0")
    _rollout(st, "c2", "g3", 1.0, pv="p0")
    _rollout(st, "d1", "g4", 0.5)
    _rollout(st, "d2", "g4", 0.5)  # all-equal group
    st.start_rollout("e1", group_id="g4", task_id="t1")  # unfinished


def test_export_verl_numbers_exclusions_and_readers(store, tmp_path):
    _seed(store)
    m = export(store, tmp_path / "x", ExportConfig(format="verl", max_policy_lag=0))
    assert m["exclusions"] == {"incomplete_group": 1, "infra_error": 1, "no_reward": 1, "stale_policy": 2}
    assert m["counts"]["unfinished"] == 1 and m["counts"]["all_equal_groups"] == 1 and m["merge_rate"] == 0.5
    df = pd.read_parquet(tmp_path / "x" / "trajectories-00000.parquet")
    assert list(df["rollout_id"]) == ["a1", "a2", "a3", "d1", "d2"]
    std = math.sqrt(((1 - 2 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)
    assert list(df["advantage"]) == pytest.approx([(1 / 3) / (std + 1e-6)] * 2 + [-(2 / 3) / (std + 1e-6), 0, 0])
    assert list(df["reward_score"]) == [1.0, 1.0, 0.0, 0.5, 0.5] and list(df["reward_source"])[1] == "judge"
    assert all("_" not in part for k in df["key"] for part in [k.split("_")[0]]) and df["key"][0] == "g1_a1_0"
    for _, r in df.iterrows():
        assert len(r.response_ids) == len(r.response_mask) == len(r.response_logprobs)
    rows = duckdb.sql(f"select count(*), min(num_turns) from '{tmp_path}/x/trajectories-*.parquet'").fetchone()
    assert rows == (5, 2)
    import datasets  # Hugging Face datasets, the loader trainers use; local files only, nothing from a hub

    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "x" / "trajectories-*.parquet"),
                               split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert ds.num_rows == 5 and ds[0]["response_ids"] == list(df["response_ids"][0])
    prompts = pq.read_table(tmp_path / "x" / "rl_prompts-00000.parquet").to_pylist()
    assert [p["extra_info"]["group_id"] for p in prompts] == ["g1", "g4"] and prompts[0]["agent_name"] == "openforge"
    assert prompts[0]["extra_info"]["harness"] == "h" and prompts[0]["extra_info"]["task_source"] == "swe-gym"
    assert prompts[0]["data_source"] == "openforge" and prompts[0]["prompt"][0]["role"] == "system"
    with store.engine.connect() as conn:
        n = conn.execute(sa.text("select count(*) from exclusions where export_id = :e"), {"e": m["export_id"]}).scalar()
    assert n == 5
    assert m["lineage"]["harnesses"] == ["h@1"] and m["lineage"]["image_digests"] == ["sha256:img"]


def test_exports_are_byte_identical_and_pinned(store, tmp_path):
    _seed(store)
    wm = store.watermark()
    for fmt in ("verl", "trl", "sft"):
        cfg = ExportConfig(format=fmt, where="outcome != 'harness_error'", allow_partial_groups=True,
                           row_group_rows=2, rows_per_shard=3)
        m1 = export(store, tmp_path / f"{fmt}1", cfg, as_of=wm)
        m2 = export(store, tmp_path / f"{fmt}2", cfg, as_of=wm)
        assert m1 == m2 and len(m1["files"]) >= 2
        for f in m1["files"] + [{"path": "manifest.json"}]:
            assert (tmp_path / f"{fmt}1" / f["path"]).read_bytes() == (tmp_path / f"{fmt}2" / f["path"]).read_bytes()
    _rollout(store, "f1", "g2", 1.0)  # new data arrives (and the exports above wrote exclusion rows)
    cfg = ExportConfig(format="verl", where="outcome != 'harness_error'", allow_partial_groups=True,
                       row_group_rows=2, rows_per_shard=3)
    m3 = export(store, tmp_path / "verl3", cfg, as_of=wm)
    m1 = __import__("json").loads((tmp_path / "verl1" / "manifest.json").read_text())
    assert m3 == m1
    for f in m1["files"] + [{"path": "manifest.json"}]:
        assert (tmp_path / "verl1" / f["path"]).read_bytes() == (tmp_path / "verl3" / f["path"]).read_bytes()
    # a3 is filtered but still counts in g1's statistics (3 of 3: complete); b1 alone is an incomplete group
    assert m1["exclusions"] == {"filtered": 1, "incomplete_group": 1, "infra_error": 1, "no_reward": 1}
    assert verify(tmp_path / "verl1" / "manifest.json", store)["ok"]
    sft = duckdb.sql(f"select * from '{tmp_path}/sft1/conversations-*.parquet'").df()
    assert len(sft) == 8 and sft["messages"][0][0]["role"] == "system" and sft["token_exact"].all()


def test_verify_catches_changed_file_and_changed_store_row(store, tmp_path):
    _seed(store)
    m = export(store, tmp_path / "x", ExportConfig(format="trl"))
    assert verify(tmp_path / "x" / "manifest.json", store) == {"ok": True, "problems": [], "export_id": m["export_id"]}
    shard = tmp_path / "x" / m["files"][1]["path"]
    saved = shard.read_bytes()
    shard.write_bytes(saved[:-10] + b"0123456789")
    problems = verify(tmp_path / "x" / "manifest.json", store)["problems"]
    assert "file changed on disk" in problems[0] and "cannot be read as Parquet" in problems[1]
    shard.write_bytes(saved)
    with store.engine.begin() as conn:
        conn.execute(sa.text("update rewards set value = 0.25 where rollout_id = 'd1'"))
    res = verify(tmp_path / "x" / "manifest.json", store)
    assert not res["ok"] and res["problems"][0].startswith("samples-*.parquet: re-derived from the store, the rows "
                                                          "differ: 0 missing from the files, 0 extra in the files, "
                                                          "2 changed: advantage, reward (first: d1#0)")


def test_call_cost_shapes_advantages_by_calls_never_pays_failures(store, tmp_path):
    """Efficiency shaping: of two successes the one with fewer model calls gets the larger advantage; a failure's
    zero reward stays zero however few calls it made; the manifest keeps the setting and verify re-derives it."""
    store.register_task("t1", source="gen", verifier_hash="vh")
    store.register_harness("h", "1")
    store.register_policy_version("p1", model_name="m", global_step=1)
    store.create_group("g", task_id="t1", target_size=3, policy_version_id="p1")
    _rollout(store, "short", "g", 1.0, turns=1)
    _rollout(store, "long", "g", 1.0, turns=4)
    _rollout(store, "quit", "g", 0.0, outcome="failure", turns=1)
    plain = export(store, tmp_path / "plain", ExportConfig(format="verl"))
    shaped = export(store, tmp_path / "shaped", ExportConfig(format="verl", call_cost=0.1))
    adv = lambda d: dict(zip(*[pd.read_parquet(tmp_path / d / "trajectories-00000.parquet")[c]  # noqa: E731
                               for c in ("rollout_id", "advantage")]))
    a, b = adv("plain"), adv("shaped")
    assert a["short"] == pytest.approx(a["long"]) and a["quit"] < 0
    rewards = [1.0, 0.9 ** 3, 0.0]   # by hand: reward * (1 - 0.1) ** (calls - 1)
    expect = group_advantages(rewards, GrpoConfig()).advantages
    assert [b["short"], b["long"], b["quit"]] == pytest.approx(expect)
    assert b["short"] > b["long"] > 0 > b["quit"]
    assert shaped["config"]["call_cost"] == 0.1 and "call_cost" not in plain["config"]
    assert verify(tmp_path / "shaped" / "manifest.json", store)["ok"]
    # a --where that keeps part of the group: the filtered rollouts still count with their own number of calls
    part = export(store, tmp_path / "part", ExportConfig(format="verl", call_cost=0.1, where="outcome = 'failure'",
                                                         allow_partial_groups=True))
    assert part["counts"]["rows"] and adv("part") == pytest.approx({"quit": b["quit"]})
    with pytest.raises(ValueError, match="call_cost=1.0"):
        ExportConfig(call_cost=1.0)


def test_success_at_takes_partial_credit_out_of_the_advantages(store, tmp_path):
    """A group of partial credits and no success has no signal under success_at (every rollout counts 0); a
    success among partials gets the advantage and every partial the same negative one; the manifest keeps it."""
    store.register_task("t1", source="gen", verifier_hash="vh")
    store.register_harness("h", "1")
    store.register_policy_version("p1", model_name="m", global_step=1)
    for g, rewards in (("partial", [0.5, 0.0, 0.333]), ("mixed", [1.0, 0.5, 0.0])):
        store.create_group(g, task_id="t1", target_size=3, policy_version_id="p1")
        for k, r in enumerate(rewards):
            _rollout(store, f"{g}{k}", g, r, outcome="success" if r >= 1 else "failure", turns=1)
    plain = export(store, tmp_path / "plain", ExportConfig(format="verl"))
    binary = export(store, tmp_path / "binary", ExportConfig(format="verl", success_at=1.0))
    adv = lambda d: dict(zip(*[pd.read_parquet(tmp_path / d / "trajectories-00000.parquet")[c]  # noqa: E731
                               for c in ("rollout_id", "advantage")]))
    a, b = adv("plain"), adv("binary")
    assert a["partial0"] > 0 and a["mixed1"] != a["mixed2"]   # partial credit moves the plain advantages
    assert b["partial0"] == b["partial1"] == b["partial2"] == 0.0
    assert b["mixed0"] == pytest.approx(group_advantages([1.0, 0.0, 0.0], GrpoConfig()).advantages[0])
    assert b["mixed1"] == pytest.approx(b["mixed2"]) and b["mixed1"] < 0
    assert binary["config"]["success_at"] == 1.0 and "success_at" not in plain["config"]
    assert verify(tmp_path / "binary" / "manifest.json", store)["ok"]
    with pytest.raises(ValueError, match="success_at=0"):
        ExportConfig(success_at=0)
