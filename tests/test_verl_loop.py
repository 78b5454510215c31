"""veRL's `openforge` agent loop and weight fence, in the project venv (no veRL): real bubblewrap sandboxes, the
embedded recording proxy in front of the scripted upstream, a real store. What the loop returns for a sample is
compared with the store's reconstruction and with the export; drops come with their stored exclusion; the fence
pauses, records the version with its global step and parent, resumes. veRL's own types run in
tests/slow/test_verl_agent_loop.py."""

from __future__ import annotations

import json
import os
import stat

import pyarrow.parquet as pq
import pytest

from learner import ExportConfig, export, reconstruct_rollout
from openforge.verl_fence import WeightFence, read_proxy_file, write_proxy_file
from openforge.verl_loop import LoopConfig, VerlRollouts
from proxy.engines.scripted.script import Text, ToolCall, ToolCalls
from rollout import load_task
from tests.conftest import make_call
from tests.rollout_fixtures import ANSWER_TEST, write_task

ANSWER = ANSWER_TEST.replace("#!/bin/bash\n", '#!/bin/bash\ncd "$OPENFORGE_WORKSPACE"\n', 1)


def _loop(forge, shared_tmp, **cfg) -> VerlRollouts:
    pf = write_proxy_file(shared_tmp / "proxy.json", url=forge.proxy.url, admin_token=forge.proxy.admin_token,
                          socket=str(forge.proxy.socket_path), model="mock-model")
    c = LoopConfig.from_mapping({"store": forge.store.url, "tasks": str(shared_tmp / "tasks"), "proxy_file": str(pf),
                                 "sandbox_root": str(forge.root), **cfg})
    return VerlRollouts(c)


def _answer_task(shared_tmp, name="answer", test_sh=ANSWER):
    return load_task(write_task(shared_tmp / "tasks", name, test_sh=test_sh, instruction="Write 42 into answer.txt."))


def test_a_sample_is_the_stored_rollout_token_for_token_and_the_export_row_runs_it(forge, shared_tmp):
    task = _answer_task(shared_tmp)
    forge.up.double.script.extend([ToolCalls([ToolCall("bash", {"command": "echo 42 > answer.txt"})]), Text("Done.")])
    loop = _loop(forge, shared_tmp, harness="react")
    try:
        s = loop.run_sample({"uid": "u1", "extra_info": {"task_id": task.id}}, sampling_params={"temperature": 0.7},
                            session_id=0, global_steps=3)
        assert s.dropped is None and s.rollout_id and len(s.outputs) == 1, s
        calls = forge.store.calls(s.rollout_id)
        (seg,) = reconstruct_rollout(calls).segments
        (out,) = s.outputs
        assert out["prompt_ids"] == seg.prompt_ids and out["response_ids"] == seg.response_ids
        assert out["response_mask"] == seg.response_mask and out["response_logprobs"] == seg.response_logprobs
        assert 0 in out["response_mask"] and out["num_turns"] == seg.num_turns == len(calls) == 2
        (reward,) = forge.store.rewards(s.rollout_id)
        assert out["reward_score"] == reward.value == 1.0 and reward.source == "verifier"
        lin = out["extra_fields"]["openforge"]
        assert lin["rollout_id"] == s.rollout_id and lin["call_ids"] == [c.id for c in calls]
        assert lin["reward_id"] == reward.id and lin["outcome"] == "success" and lin["verl_uid"] == "u1"
        assert out["extra_fields"]["reward_extra_info"] == {}
        ev = [e for e in forge.store.events(s.rollout_id) if e.kind == "verl.sample"]
        assert ev and ev[0].detail["global_steps"] == 3 and ev[0].detail["session_id"] == 0

        # the export of that store: its trajectory row is the loop's output, its prompt row runs the loop
        export(forge.store, shared_tmp / "x", ExportConfig(format="verl", singleton="verl"))
        (row,) = pq.read_table(shared_tmp / "x" / "trajectories-00000.parquet").to_pylist()
        assert row["prompt_ids"] == out["prompt_ids"] and row["response_ids"] == out["response_ids"]
        assert row["response_mask"] == out["response_mask"] and row["reward_score"] == out["reward_score"]
        (prompt,) = pq.read_table(shared_tmp / "x" / "rl_prompts-00000.parquet").to_pylist()
        assert prompt["agent_name"] == "openforge" and prompt["data_source"] == "openforge"
        assert prompt["extra_info"]["task_id"] == task.id and prompt["extra_info"]["harness"] == "react"
        assert prompt["extra_info"]["verifier_hash"] == task.verifier_hash
        assert prompt["reward_model"] == {"style": "openforge-verifier", "ground_truth": ""}
        forge.up.double.script.extend([Text("I will not.")])
        again = loop.run_sample(prompt, session_id=1, global_steps=4)
        assert again.dropped is None and [o["reward_score"] for o in again.outputs] == [0.0]
    finally:
        loop.close()


def test_an_infra_error_is_a_dropped_sample_with_its_exclusion_never_a_zero(forge, shared_tmp):
    task = _answer_task(shared_tmp, "broken", test_sh="echo oops >&2; exit 2")  # the verifier crashes
    forge.up.double.script.extend([Text("done"), Text("done")])
    loop = _loop(forge, shared_tmp, harness="react", max_infra_retries=1)
    try:
        s = loop.run_sample({"uid": "u2", "extra_info": {"task_id": task.id}}, session_id=0, global_steps=1)
    finally:
        loop.close()
    assert s.outputs == [] and s.dropped == "infra_error" and s.detail["kind"] == "verifier_crashed"
    attempts = s.detail["attempts"]
    assert len(attempts) == 2 and s.rollout_id == attempts[-1]
    excl = [e for e in forge.store.lineage("exclusions") if e["rollout_id"] in attempts]
    assert sorted(e["rollout_id"] for e in excl) == sorted(attempts) and {e["reason"] for e in excl} == {"infra_error"}
    for rid in attempts:
        assert forge.store.rewards(rid) == []
    assert [e.detail["reason"] for e in forge.store.events(s.rollout_id) if e.kind == "verl.sample_dropped"] == [
        "infra_error"]


def _synthetic(store, rid, policy, *, reward=None, turns=2):
    store.start_rollout(rid, task_id="t", policy_version_id=policy)
    prompt = [1, 2, 3]
    for t in range(turns):
        comp = [10 + t, 11 + t, 2]
        store.record_call(make_call(f"{rid}-c{t}", rid, t, prompt_ids=prompt, completion_ids=comp))
        prompt = prompt + comp + [50 + t]
    store.finish_rollout(rid, "success")
    if reward is not None:
        store.add_reward(rid, reward, verifier_version="v1")
    assert store.flush(30)


def test_stale_policy_missing_reward_and_too_long_segments_are_dropped_with_their_reason(forge, shared_tmp):
    _answer_task(shared_tmp)
    st = forge.store
    for step in (0, 1, 2):
        forge.admin.register_policy_version(f"verl-step{step}", "mock-model", global_step=step)
    _synthetic(st, "r-old", "verl-step0", reward=1.0)
    _synthetic(st, "r-ok", "verl-step1", reward=0.5)
    _synthetic(st, "r-none", "verl-step2")
    loop = _loop(forge, shared_tmp, max_policy_lag=1)
    try:
        old = loop.outputs("r-old")
        assert old.outputs == [] and old.dropped == "stale_policy" and old.detail["lag"] == 2
        ok = loop.outputs("r-ok")
        assert ok.dropped is None and [o["reward_score"] for o in ok.outputs] == [0.5]
        assert ok.outputs[0]["extra_fields"]["min_global_steps"] == 1
        none = loop.outputs("r-none")
        assert none.outputs == [] and none.dropped == "no_reward"
        long = loop.outputs("r-ok", max_response_len=3)
        assert long.outputs == [] and long.dropped == "truncated"
    finally:
        loop.close()
    st.flush(30)
    reasons = {(e["rollout_id"], e["reason"]) for e in st.lineage("exclusions")}
    assert {("r-old", "stale_policy"), ("r-none", "no_reward"), ("r-ok", "truncated")} <= reasons


def test_the_weight_fence_pauses_records_the_step_and_its_parent_and_resumes(forge):
    forge.admin.register_policy_version("verl-step0", "mock-model", global_step=0)
    fence = WeightFence(forge.admin, model_name="mock-model")
    seen = []
    fence.update(1, lambda: seen.append(forge.admin.status()))
    assert seen[0]["paused"] is True and seen[0]["in_flight"] == 0 and seen[0]["policy_version"] == "verl-step0"
    st = forge.admin.status()
    assert st["paused"] is False and st["policy_version"] == "verl-step1"
    fence.update(2, lambda: None)
    fence.update(2, lambda: None)  # a re-sync of the active version records nothing new
    assert forge.store.flush(30)
    rows = {r["id"]: r for r in forge.store.lineage("policy_versions")}
    assert rows["verl-step1"]["global_step"] == 1 and rows["verl-step1"]["metadata"]["parent"] == "verl-step0"
    assert rows["verl-step2"]["metadata"]["parent"] == "verl-step1" and rows["verl-step2"]["engine"] == "vllm"
    assert forge.admin.status()["policy_version"] == "verl-step2"

    def broken():
        raise RuntimeError("nccl timeout")

    with pytest.raises(Exception, match="nccl timeout"):
        fence.update(3, broken)
    st = forge.admin.status()
    assert st["paused"] is False and st["policy_version"] == "verl-step2"  # a failed update changes nothing


def test_proxy_file_is_owner_only_and_errors_say_the_fix(tmp_path):
    p = write_proxy_file(tmp_path / "d" / "proxy.json", url="http://127.0.0.1:1", admin_token="secret",
                         socket=None, model="m")
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600 and read_proxy_file(p)["admin_token"] == "secret"
    with pytest.raises(FileNotFoundError, match="trainer_mode=openforge_sync"):
        read_proxy_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text(json.dumps({"url": "x"}))
    with pytest.raises(ValueError, match="write_proxy_file"):
        read_proxy_file(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="unknown setting.*storee"):
        LoopConfig.from_mapping({"storee": "x", "tasks": "t", "proxy_file": "p"})
    with pytest.raises(ValueError, match="store not set"):
        LoopConfig.from_mapping({"tasks": "t", "proxy_file": "p"})


def test_the_modules_import_without_verl_and_the_class_needs_it():
    import importlib.util

    import openforge.verl_loop as vl

    if importlib.util.find_spec("verl") is not None:
        pytest.skip("veRL is installed in this venv: the slow tier builds the class")
    with pytest.raises(ModuleNotFoundError, match="verl"):
        vl.OpenForgeAgentLoop  # noqa: B018 (built on first access, importing veRL)
