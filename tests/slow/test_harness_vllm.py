"""The real harness binaries through the recording proxy in front of a real vLLM on the CPU.

One ``codex exec`` (Responses API), one ``claude -p`` (Messages API) and one ``gemini -p`` (Gemini API) run each,
with the helpers of ``tests/test_harness_e2e.py`` and the session's vLLM server (SmolLM2-135M-Instruct) as the
upstream. SmolLM2's chat template has no tools, so the model just answers and the run ends after it; what it says is
not checked. Each run must exit 0, and every call must be in the store, token-exact, with the engine's ids: the
prompt ids are what vLLM's ``/tokenize`` makes of the stored (translated) messages.

CPU prefill is the cost (one engine thread on a 2-core box: ~37 s for Claude Code's default ~3k-token prompt, ~45 s
for Codex's ~4.6k): the harnesses' prompts are cut down to a short system prompt (Claude Code: ``--system-prompt``,
``--tools ""``; Codex: ``model_instructions_file``, no environment context; Gemini CLI: ``GEMINI_SYSTEM_MD``, its
shell tool only), ~140-650 tokens, ~5 s a run. Their output stops at 64 tokens (Claude Code:
``CLAUDE_CODE_MAX_OUTPUT_TOKENS``; Gemini CLI: a ``modelConfigs`` override, which also sets temperature 0 where it
would send 1; Codex sends no limit, the server's default applies) and decoding is greedy (the server's default
temperature): the task is one that greedy SmolLM2 answers in a few tokens, since a harness fails its run on a
truncated answer. The server still takes full prompts, up to its ``MAX_MODEL_LEN`` (SmolLM2's 8192 positions).
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from proxy.engines.vllm_cpu import MODEL_NAME
from tests.proxy_fixtures import Up, make_proxy
from tests.test_harness_e2e import run_claude, run_codex, run_gemini

pytestmark = pytest.mark.slow

TASK = "What is the capital of France?"  # greedy SmolLM2 ends its answer well within 64 tokens
SYSTEM = "You are a terse assistant. Answer in one short sentence."
TIMEOUT_S = 240


@pytest.fixture
def vpx(vllm_server, tmp_path):
    root = vllm_server.removesuffix("/v1")
    px, serve = make_proxy(Up(double=None, url=root, server=None), tmp_path)
    yield px, root
    serve.stop()
    px.store.close()


def _tokenize(root: str, messages: list[dict], tools: list | None) -> list[int]:
    body = {"model": MODEL_NAME, "messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    r = httpx.post(root + "/tokenize", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["tokens"]


def _check(px, root: str, rollout_id: str, surface: str, started: float) -> None:
    calls = px.calls(rollout_id)
    assert calls, "no call recorded"
    took = time.monotonic() - started
    print(f"\n{rollout_id}: {len(calls)} call(s) in {took:.1f}s: " + ", ".join(
        f"{len(c.prompt_token_ids or [])}+{len(c.completion_token_ids or [])} tokens {c.latency_ms or 0:.0f}ms"
        for c in calls))
    for c in calls:
        assert c.api_surface == surface and c.error_class is None, (c.error_class, c.error_detail)
        assert c.token_exact and c.prompt_token_ids and c.completion_token_ids
        assert c.prompt_token_ids == _tokenize(root, c.messages, c.tools)


def test_codex_exec_against_vllm(vpx, tmp_path):
    px, root = vpx
    workdir = tmp_path / "work"
    workdir.mkdir()
    instructions = tmp_path / "instructions.md"
    instructions.write_text(SYSTEM)
    config = f"""model_instructions_file = {json.dumps(str(instructions))}
include_environment_context = false
include_apps_instructions = false
include_collaboration_mode_instructions = false
project_doc_max_bytes = 0
model_context_window = 8192
"""
    t0 = time.monotonic()
    p = run_codex(px, px.register("codex-vllm"), workdir, model=MODEL_NAME, config=config, task=TASK,
                  timeout=TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    _check(px, root, "codex-vllm", "responses", t0)


def test_claude_code_print_against_vllm(vpx, tmp_path):
    px, root = vpx
    workdir = tmp_path / "work"
    workdir.mkdir()
    t0 = time.monotonic()
    p = run_claude(px, px.register("claude-vllm"), workdir, model=MODEL_NAME, task=TASK, timeout=TIMEOUT_S,
                   args=("--system-prompt", SYSTEM, "--tools", ""),
                   env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "64", "ANTHROPIC_SMALL_FAST_MODEL": MODEL_NAME,
                        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL_NAME})
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    assert json.loads(p.stdout)["is_error"] is False, p.stdout[-2000:]
    _check(px, root, "claude-vllm", "messages", t0)


def test_gemini_cli_prompt_against_vllm(vpx, tmp_path):
    px, root = vpx
    workdir = tmp_path / "work"
    workdir.mkdir()
    system = tmp_path / "system.md"
    system.write_text(SYSTEM)
    greedy = {"match": {"model": MODEL_NAME},
              "modelConfig": {"generateContentConfig": {"temperature": 0, "maxOutputTokens": 64}}}
    t0 = time.monotonic()
    p = run_gemini(px, px.register("gemini-vllm"), workdir, model=MODEL_NAME, task=TASK, timeout=TIMEOUT_S,
                   settings={"tools": {"core": ["run_shell_command"]},
                             "modelConfigs": {"customOverrides": [greedy]}},
                   env={"GEMINI_SYSTEM_MD": str(system)})
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    assert "error" not in json.loads(p.stdout[p.stdout.index("{"):]), p.stdout[-2000:]
    _check(px, root, "gemini-vllm", "gemini", t0)
