"""Exports by run purpose, and the SFT shard in TRL's conversational format (real SQLite and PostgreSQL).

The SFT shard must hold only what the exclusions allow: no evaluation rollout, no truncated completion as an
assistant turn (nor any later call whose history carries it), and it must load through Hugging Face ``datasets``
into the ``messages`` / ``tools`` shape TRL's SFTTrainer trains on (tests/slow/test_learner_train.py trains it).
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from forge_store import open_store
from forge_store.testing import REACT_TOOLS, Turn, agent_calls
from learner import ExportConfig, export, verify

SOLVE = [Turn([("bash", {"command": "ls"})], ["a.txt\n"]), Turn([("bash", {"command": "mv a.txt b.txt"})], [""]),
         Turn(text="Done.")]


@pytest.fixture
def store(store_url, settings):
    st = open_store(store_url, settings=settings)
    yield st
    st.close()


def _rollout(st, rid, gid, purpose, reward, *, pv="student", turns=SOLVE, truncate_at=None, drop_null_content=False):
    meta = {"purpose": purpose} if purpose else None
    st.start_rollout(rid, group_id=gid, task_id="t1", policy_version_id=pv, harness_id="react@1", metadata=meta)
    for i, rec in enumerate(agent_calls(rid, turns, policy_version_id=pv)):
        if i == truncate_at:
            rec.finish_reason = "length"
        if drop_null_content:   # the react harness sends its answers back without "content": null
            rec.messages = [{k: v for k, v in m.items() if v is not None} for m in rec.messages]
        st.record_call(rec)
    st.finish_rollout(rid, "success" if reward else "failure")
    st.add_reward(rid, reward)


def _seed(st):
    st.register_task("t1", source="taskgen")
    st.register_policy_version("student", model_name="m", global_step=0)
    st.register_policy_version("teacher", model_name="scripted", global_step=0)
    for g in ("gt", "ge", "gs", "go"):
        st.create_group(g, task_id="t1", target_size=2)
    _rollout(st, "t-1", "gt", "teacher", 1.0, pv="teacher")
    _rollout(st, "t-2", "gt", "teacher", 1.0, pv="teacher", drop_null_content=True)
    _rollout(st, "e-1", "ge", "eval", 1.0)
    _rollout(st, "e-2", "ge", "eval", 0.0)
    _rollout(st, "s-1", "gs", "train", 1.0)
    _rollout(st, "s-2", "gs", "train", 0.0, truncate_at=1)   # the harness keeps the cut answer and goes on
    _rollout(st, "o-1", "go", None, 1.0)                     # recorded before runs had a purpose: train
    _rollout(st, "o-2", "go", None, 0.0)


def _exclusions(st, export_id):
    with st.engine.connect() as conn:
        rows = conn.execute(sa.text("select reason, rollout_id, call_id from exclusions where export_id = :e "
                                    "order by rollout_id, call_id"), {"e": export_id}).all()
    return [tuple(r) for r in rows]


def test_grpo_exports_leave_out_teacher_and_eval_rollouts(store, tmp_path):
    _seed(store)
    for fmt, prefix in (("verl", "trajectories"), ("trl", "samples")):
        m = export(store, tmp_path / fmt, ExportConfig(format=fmt))
        rows = pq.read_table(tmp_path / fmt / f"{prefix}-00000.parquet").to_pylist()
        assert sorted({r["rollout_id"] for r in rows}) == ["o-1", "o-2", "s-1", "s-2"]
        assert m["exclusions"] == {"evaluation": 2, "teacher": 2, "truncated": 1}
        ex = _exclusions(store, m["export_id"])
        assert [(r, ro) for r, ro, _ in ex if r in ("evaluation", "teacher")] == [
            ("evaluation", "e-1"), ("evaluation", "e-2"), ("teacher", "t-1"), ("teacher", "t-2")]
    assert pq.read_table(tmp_path / "verl" / "rl_prompts-00000.parquet").num_rows == 2


def test_where_filters_on_purpose(store, tmp_path):
    _seed(store)
    m = export(store, tmp_path / "x", ExportConfig(format="sft", where="purpose = 'teacher'"))
    rows = pq.read_table(tmp_path / "x" / "conversations-00000.parquet").to_pylist()
    assert {r["rollout_id"] for r in rows} == {"t-1", "t-2"} and {r["purpose"] for r in rows} == {"teacher"}
    assert m["exclusions"]["filtered"] == 4 and m["exclusions"]["evaluation"] == 2


def test_sft_shard_shape_and_exclusions(store, tmp_path):
    _seed(store)
    m = export(store, tmp_path / "x", ExportConfig(format="sft"))
    assert m["exclusions"] == {"evaluation": 2, "truncated": 2}
    ex = _exclusions(store, m["export_id"])
    # s-2's call 1 was cut at max_tokens; call 2's history carries that answer as an assistant turn, so it goes too
    assert [e for e in ex if e[0] == "truncated"] == [("truncated", "s-2", "s-2-c1"), ("truncated", "s-2", "s-2-c2")]
    with store.engine.connect() as conn:
        detail = conn.execute(sa.text("select detail from exclusions where call_id = 's-2-c2' and export_id = :e"),
                              {"e": m["export_id"]}).scalar_one()
    detail = json.loads(detail) if isinstance(detail, str) else detail
    assert detail["answer_of"] == "s-2-c1" and "SFT trains on every assistant turn" in detail["rule"]
    rows = pq.read_table(tmp_path / "x" / "conversations-00000.parquet").to_pylist()
    by = {r["rollout_id"]: r for r in rows}
    assert sorted(by) == ["o-1", "o-2", "s-1", "s-2", "t-1", "t-2"] and len(rows) == 6   # one whole conversation each
    t1 = by["t-1"]
    assert [msg["role"] for msg in t1["messages"]] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                                       "assistant"]
    call = t1["messages"][2]["tool_calls"][0]
    assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"]) == {"command": "ls"}
    assert t1["messages"][3]["tool_call_id"] == call["id"] and t1["messages"][-1]["content"] == "Done."
    assert [json.loads(t) for t in t1["tools"]] == REACT_TOOLS
    assert t1["call_ids"] == ["t-1-c0", "t-1-c1", "t-1-c2"] and t1["purpose"] == "teacher"
    # a harness that sends its answers back without "content": null still makes one conversation
    assert by["t-2"]["call_ids"] == ["t-2-c0", "t-2-c1", "t-2-c2"]
    assert by["o-1"]["purpose"] == "train"
    # s-2: only the turn before the cut, and no assistant turn that is not the answer of a call that passed
    assert by["s-2"]["call_ids"] == ["s-2-c0"] and [x["role"] for x in by["s-2"]["messages"]][-1] == "assistant"
    assert sum(x["role"] == "assistant" for x in by["s-2"]["messages"]) == 1


def test_sft_shard_loads_as_trl_conversations(store, tmp_path):
    """Hugging Face ``datasets`` decodes the JSON columns: arguments and tools come back as the dicts a chat template
    (and TRL's SFTTrainer) expects, and the messages pass TRL's own conversational check."""
    import datasets

    _seed(store)
    export(store, tmp_path / "x", ExportConfig(format="sft", where="purpose = 'teacher'"))
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "x" / "conversations-*.parquet"), split="train",
                               cache_dir=str(tmp_path / "hf-cache"))
    row = ds[0]
    assert isinstance(row["messages"], list) and row["messages"][0]["role"] == "system"   # TRL's is_conversational
    assert row["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}
    assert row["tools"] == REACT_TOOLS


def test_sft_export_is_byte_identical_and_verifies(store, tmp_path):
    _seed(store)
    cfg = ExportConfig(format="sft", row_group_rows=2, rows_per_shard=3)
    wm = store.watermark()
    m1 = export(store, tmp_path / "a", cfg, as_of=wm)
    _rollout(store, "t-3", "gt", "teacher", 1.0, pv="teacher")   # later data: not in an export pinned to wm
    m2 = export(store, tmp_path / "b", cfg, as_of=wm)
    assert m1 == m2 and len(m1["files"]) == 3
    for f in m1["files"] + [{"path": "manifest.json"}]:
        assert (tmp_path / "a" / f["path"]).read_bytes() == (tmp_path / "b" / f["path"]).read_bytes()
    assert verify(tmp_path / "a" / "manifest.json", store)["ok"]


def test_sft_leaves_out_image_calls_and_foreign_assistant_turns(store, tmp_path):
    recs = {"img": agent_calls("img", SOLVE), "foreign": agent_calls("foreign", SOLVE)}
    recs["img"][2].messages = recs["img"][2].messages + [{"role": "user", "content": [
        {"type": "text", "text": "the screen:"}, {"type": "image_url", "image_url": {"url": "data:,x"}}]}]
    c1 = recs["foreign"][1]
    c1.messages = [c1.messages[0], {"role": "assistant", "content": "an example answer"}] + c1.messages[1:]
    for rid, calls in recs.items():
        store.start_rollout(rid, metadata={"purpose": "teacher"})
        for rec in calls:
            store.record_call(rec)
        store.finish_rollout(rid, "success")
    m = export(store, tmp_path / "x", ExportConfig(format="sft"))
    # foreign-c2's history holds foreign-c1's answer, which is left out: so is foreign-c2, with c1's reason
    assert m["exclusions"] == {"filtered": 1, "missing_data": 2}
    rows = pq.read_table(tmp_path / "x" / "conversations-00000.parquet").to_pylist()
    assert [r["call_ids"] for r in rows] == [["foreign-c0"], ["img-c0", "img-c1"]]
