"""One end-to-end rollout per harness adapter: the real harness, unmodified, in a bubblewrap sandbox, on an example
task, against the scripted upstream through the embedded proxy; the rollout, its calls and its reward are in the
store. The scripted model makes the harness run the task's reference solution with its own shell tool, then stop."""

from __future__ import annotations

import json
import os

import pytest

from proxy.engines.scripted.script import Text, ToolCall, ToolCalls
from rollout._backends.base import PhaseResult
from rollout._harnesses import get_harness, npm
from rollout._harnesses.base import LaunchContext
from rollout._task import load_task
from tests.rollout_fixtures import EXAMPLES

TASK = "files-config-to-json"
SURFACE = {"react": "chat.completions", "mini-swe-agent": "chat.completions", "codex": "responses", "claude-code": "messages",
           "gemini-cli": "gemini"}


def _plan(name: str, solve: str) -> list:
    if name == "codex":
        return [ToolCalls([ToolCall("exec_command", {"cmd": solve})]), Text("Done.")]
    if name == "claude-code":
        return [ToolCalls([ToolCall("Bash", {"command": solve, "description": "write config.json"})]), Text("Done.")]
    if name == "gemini-cli":
        return [ToolCalls([ToolCall("run_shell_command", {"command": solve})]), Text("Done.")]
    if name == "mini-swe-agent":   # mini runs actions with /bin/sh (dash): hand the bash script to bash
        script = f"bash <<'OPENFORGE_SOLVE'\n{solve}\nOPENFORGE_SOLVE"
        return [ToolCalls([ToolCall("bash", {"command": script})]),
                ToolCalls([ToolCall("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})])]
    return [ToolCalls([ToolCall("bash", {"command": solve})]), Text("Done.")]


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["react", "mini-swe-agent", "codex", "claude-code", "gemini-cli"])
def test_adapter_end_to_end(forge, name):
    harness = get_harness(name)
    if not harness.is_installed():
        msg = f"{name} is not installed: {harness.install_hint()}"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    task = load_task(EXAMPLES / TASK)
    forge.up.double.max_model_len = 262_144          # harness system prompts are long
    forge.up.double.script.extend(_plan(name, (task.path / "solution" / "solve.sh").read_text()))
    summary = forge.run([task], harness, agent_timeout_s=180)
    (res,) = summary.results
    assert res.outcome == "success" and res.reward == 1.0, (res.outcome, res.detail[-3000:])
    s = forge.store
    ro = s.rollout(res.rollout_id)
    assert ro.harness_id.startswith(f"{name}@") and "unknown" not in ro.harness_id
    calls = s.calls(ro.id)
    assert len(calls) >= 2, [c.response for c in calls]
    assert all(c.api_surface == SURFACE[name] and c.token_exact and c.error_class is None for c in calls)
    asked = next(c for c in calls if c.finish_reason == "tool_calls")
    assert asked.response["tool_calls"], asked.response
    assert [r.value for r in s.rewards(ro.id)] == [1.0]


def test_the_npm_pins_are_the_makefiles():
    makefile = (EXAMPLES.parents[1] / "Makefile").read_text()
    for var, pin in (("CODEX_VERSION", npm.CODEX_VERSION), ("CLAUDE_CODE_VERSION", npm.CLAUDE_CODE_VERSION),
                     ("GEMINI_CLI_VERSION", npm.GEMINI_CLI_VERSION), ("OPENCLAW_VERSION", npm.OPENCLAW_VERSION)):
        assert f"{var} ?= {pin}\n" in makefile, var


def test_gemini_cli_is_pointed_at_the_proxy_and_nothing_else(tmp_path):
    harness = get_harness("gemini-cli", cache_dir=tmp_path)
    launch = harness.launch(LaunchContext("do it", "http://127.0.0.1:8000", "ofr1.tok", "policy", "/work", "/home/u"))
    assert launch.argv[1:] == ("-p", "do it", "-m", "policy", "--yolo", "--output-format", "json")
    assert launch.env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:8000"
    assert launch.env["GEMINI_API_KEY"] == "ofr1.tok"
    ((path, data, mode),) = launch.files
    config = json.loads(data)
    assert path == "/home/u/.gemini/settings.json" and mode == 0o600
    assert config["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert config["privacy"]["usageStatisticsEnabled"] is False and config["telemetry"]["enabled"] is False
    assert config["general"]["enableAutoUpdate"] is False
    ok = harness.classify(PhaseResult("agent", 0, stdout=b'{"session_id": "s", "response": "Done."}'))
    failed = harness.classify(PhaseResult("agent", 41, stdout=b'{"error": {"message": "Invalid auth method"}}'))
    gone = harness.classify(PhaseResult("agent", 1, stderr=b"TypeError: fetch failed ECONNREFUSED"))
    assert (ok.kind, failed.kind, gone.kind) == ("finished", "error", "infra")
