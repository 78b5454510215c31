"""Rollouts against a real vLLM server on the CPU: the reference harness in bubblewrap sandboxes, a group of
SmolLM2-135M-Instruct rollouts on an example task, every call recorded token-exact and every rollout graded
(a 135M model rarely solves the task; what is checked is the recording, not the score)."""

from __future__ import annotations

import httpx
import pytest

from forge_store import RolloutFilter
from rollout._harnesses import get_harness
from rollout._task import load_task
from tests.proxy_fixtures import Up
from tests.rollout_fixtures import EXAMPLES, make_forge

pytestmark = pytest.mark.slow


def test_react_group_on_real_vllm(vllm_server, shared_tmp):
    f = make_forge(Up(None, vllm_server.removesuffix("/v1"), None), shared_tmp)
    try:
        model = httpx.get(f"{vllm_server}/models", timeout=10).json()["data"][0]["id"]
        f.admin.register_policy_version("smollm2-base", model, engine="vllm", activate=True)
        react = get_harness("react", temperature=1.0, max_tokens=96)
        summary = f.orchestrator(react, model=model, group_size=2, concurrency=2, max_turns=3).run(
            [load_task(EXAMPLES / "files-dedupe-mailing-list")])
        assert f.store.flush(30)
        assert len(summary.results) == 2 and summary.groups_complete == 1
        for ro in f.store.iter_rollouts(RolloutFilter(run_id=summary.run_id)):
            assert ro.outcome in ("success", "failure", "harness_error"), (ro.outcome, ro.outcome_detail)
            assert ro.policy_version_id == "smollm2-base"
            calls = f.store.calls(ro.id)
            assert calls and all(c.token_exact and c.prompt_token_ids and c.completion_token_ids for c in calls)
            assert all(len(c.completion_logprobs) == len(c.completion_token_ids) for c in calls)
            assert f.store.rewards(ro.id), ro.id
    finally:
        f.admin.close()
        f.proxy.stop()
        f.store.close()
