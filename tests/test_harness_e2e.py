"""The real harness binaries through the proxy: ``codex exec`` (Responses API), ``claude -p`` (Messages API) and
``gemini -p`` (Gemini API), each driven by the upstream through one shell tool call and a final answer.

Each run must exit 0, every model call must be in the store with engine token ids, and the tool output the harness
itself produced must be in the next call's stored prompt. The binaries come from ``make harnesses`` (npm, pinned);
``OPENFORGE_HARNESS_BIN`` points at them. The upstream is a fixture (``harness_upstream``): the scripted double
here; a tier against real vLLM can supply its own URL and skip the scripting (``Backend.plan``).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.engines.scripted import ScriptedUpstream, Text, ToolCall, ToolCalls, UpstreamServer
from rollout._harnesses.gemini_cli import settings as gemini_settings
from tests.proxy_fixtures import ProxyHarness, make_proxy

pytestmark = pytest.mark.e2e

TASK = "OPENFORGE-E2E: print the marker with the shell, then say you are done."
MARKER = "hi-from-openforge-e2e"
FINAL = "FINAL_ANSWER: done"
TIMEOUT_S = 120


def _bin(name: str) -> Path:
    folder = Path(os.environ.get("OPENFORGE_HARNESS_BIN", "~/.cache/openforge/npm/node_modules/.bin")).expanduser()
    path = folder / name
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing: `make harnesses` installs Codex CLI and Claude Code")
        pytest.skip(f"{path} is missing; run `make harnesses`")
    return path


@dataclass
class Backend:
    """The upstream a harness run talks to (through the proxy) and how to make it answer the task."""

    url: str
    double: ScriptedUpstream | None

    def plan(self, tool: str, arguments: dict) -> None:
        """A shell tool call first, then the final answer (only the scripted double needs to be told)."""
        if self.double is not None:
            self.double.script.extend([ToolCalls([ToolCall(tool, arguments)], match="OPENFORGE-E2E"),
                                       Text(FINAL, match="OPENFORGE-E2E")])


@pytest.fixture
def harness_upstream(tokenizer):
    double = ScriptedUpstream(tokenizer=tokenizer, max_model_len=262_144)  # harness prompts are ~20k tokens
    server = UpstreamServer(double)
    yield Backend(server.start(), double)
    server.stop()


@pytest.fixture
def e2e_px(harness_upstream, tmp_path):
    px, serve = make_proxy(harness_upstream, tmp_path)
    yield px
    serve.stop()
    px.store.close()


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8", **extra}


def run_codex(px: ProxyHarness, token: str, workdir: Path, *, websockets: bool = False, model: str = "mock-model",
              config: str = "", task: str = TASK, timeout: float = TIMEOUT_S):
    """`codex exec` through the proxy; `config` is more top-level TOML for its profile."""
    home = workdir.parent / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "openforge.config.toml").write_text(f"""
model = "{model}"
model_provider = "openforge"
{config}

[model_providers.openforge]
name = "OpenForge proxy"
base_url = "{px.url}/v1"
wire_api = "responses"
env_key = "OPENFORGE_ROLLOUT_TOKEN"
supports_websockets = {str(websockets).lower()}
request_max_retries = 0
stream_max_retries = 0
""")
    cmd = [str(_bin("codex")), "exec", "--profile", "openforge", "--skip-git-repo-check",
           "--dangerously-bypass-approvals-and-sandbox", "-C", str(workdir), task]
    env = _env(workdir.parent, CODEX_HOME=str(home), OPENFORGE_ROLLOUT_TOKEN=token)
    return subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def run_claude(px: ProxyHarness, token: str, workdir: Path, *, model: str = "mock-model",
               args: tuple[str, ...] = ("--allowedTools", "Bash"), env: dict[str, str] | None = None,
               task: str = TASK, timeout: float = TIMEOUT_S):
    """`claude -p` through the proxy; `args` and `env` are its extra flags and environment."""
    cmd = [str(_bin("claude")), "-p", task, "--model", model, "--output-format", "json", *args]
    env = _env(workdir.parent, ANTHROPIC_BASE_URL=px.url, ANTHROPIC_API_KEY=token, DISABLE_TELEMETRY="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1", DISABLE_ERROR_REPORTING="1",
               **(env or {}))
    return subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=timeout, cwd=workdir,
                          stdin=subprocess.DEVNULL)


def run_gemini(px: ProxyHarness, token: str, workdir: Path, *, model: str = "mock-model", settings: dict | None = None,
               env: dict[str, str] | None = None, task: str = TASK, timeout: float = TIMEOUT_S):
    """`gemini -p` through the proxy, with the adapter's pinned settings (``rollout._harnesses.gemini_cli``) updated by
    ``settings`` (top-level sections replaced) and ``env`` added."""
    home = workdir.parent / "gemini-home"
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps({**gemini_settings(30), **(settings or {})}))
    cmd = [str(_bin("gemini")), "-p", task, "-m", model, "--yolo", "--output-format", "json"]
    env = _env(home, GOOGLE_GEMINI_BASE_URL=px.url, GEMINI_API_KEY=token, GEMINI_CLI_NO_RELAUNCH="true", **(env or {}))
    return subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=timeout, cwd=workdir,
                          stdin=subprocess.DEVNULL)


def check_rollout(px: ProxyHarness, rollout_id: str, surface: str) -> None:
    """Every call recorded token-exact; the harness's own tool output is in the next call's stored prompt."""
    calls = px.calls(rollout_id)
    assert len(calls) >= 2, [c.response for c in calls]
    for c in calls:
        assert c.api_surface == surface and c.error_class is None, (c.error_class, c.error_detail)
        assert c.token_exact and c.prompt_token_ids and c.completion_token_ids
    asked = next(i for i, c in enumerate(calls) if c.finish_reason == "tool_calls")
    call_id = calls[asked].response["tool_calls"][0]["id"]
    nxt = calls[asked + 1]
    results = [m for m in nxt.messages if m.get("role") == "tool" and m.get("tool_call_id") == call_id]
    assert results and MARKER in json.dumps(results[0]["content"]), nxt.messages[-3:]
    assert nxt.prompt_token_ids[:len(calls[asked].prompt_token_ids)] == calls[asked].prompt_token_ids


@pytest.mark.parametrize("websockets", [False, True], ids=["http", "websocket-fallback"])
def test_codex_exec(e2e_px, harness_upstream, tmp_path, websockets):
    harness_upstream.plan("exec_command", {"cmd": f"echo {MARKER}"})
    workdir = tmp_path / "work"
    workdir.mkdir()
    p = run_codex(e2e_px, e2e_px.register("codex"), workdir, websockets=websockets)
    assert p.returncode == 0, p.stderr[-3000:]
    assert FINAL in p.stdout
    if websockets:  # it tried the websocket, got the proxy's clean refusal and went on over HTTP
        assert "Falling back from WebSockets to HTTPS transport" in p.stderr
    check_rollout(e2e_px, "codex", "responses")


def test_claude_code_print(e2e_px, harness_upstream, tmp_path):
    harness_upstream.plan("Bash", {"command": f"echo {MARKER}"})
    workdir = tmp_path / "work"
    workdir.mkdir()
    p = run_claude(e2e_px, e2e_px.register("claude"), workdir)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    result = json.loads(p.stdout)
    assert result["is_error"] is False and result["result"] == FINAL and result["num_turns"] >= 2
    check_rollout(e2e_px, "claude", "messages")


def test_gemini_cli_prompt(e2e_px, harness_upstream, tmp_path):
    harness_upstream.plan("run_shell_command", {"command": f"echo {MARKER}"})
    workdir = tmp_path / "work"
    workdir.mkdir()
    p = run_gemini(e2e_px, e2e_px.register("gemini"), workdir)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    result = json.loads(p.stdout[p.stdout.index("{"):])
    assert result["response"] == FINAL and "error" not in result
    check_rollout(e2e_px, "gemini", "gemini")
    assert all(c.streamed and c.model == "mock-model" for c in e2e_px.calls("gemini"))
