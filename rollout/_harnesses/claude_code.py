"""Adapter for Claude Code (`claude -p`, Messages API over SSE), pointed at the proxy by ANTHROPIC_BASE_URL."""

from __future__ import annotations

import json
from pathlib import Path

from .._backends.base import PhaseResult
from . import npm
from .base import HarnessExit, Launch, LaunchContext

PACKAGE = "@anthropic-ai/claude-code"


class ClaudeCodeHarness:
    name = "claude-code"

    def __init__(self, *, cache_dir: Path, max_turns: int = 30):
        self.cache_dir, self.max_turns = cache_dir, max_turns

    def is_installed(self) -> bool:
        return npm.node_installed() and (npm.npm_dir(self.cache_dir) / "node_modules" / ".bin" / "claude").exists()

    def install_hint(self) -> str:
        return npm.install_hint(self.cache_dir)

    def version(self) -> str:
        return npm.package_version(self.cache_dir, PACKAGE) or "unknown"

    def config(self) -> dict:
        return {"max_turns": self.max_turns}

    def launch(self, ctx: LaunchContext) -> Launch:
        argv = (f"{npm.MOUNT}/node_modules/.bin/claude", "-p", ctx.instruction, "--model", ctx.model,
                "--output-format", "json", "--dangerously-skip-permissions",
                "--max-turns", str(ctx.max_turns or self.max_turns))
        env = {"ANTHROPIC_BASE_URL": ctx.base_url, "ANTHROPIC_API_KEY": ctx.token, "DISABLE_TELEMETRY": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
               "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CONFIG_DIR": f"{ctx.home}/.claude"}
        return Launch(argv=argv, env=env, mounts=(npm.mount(self.cache_dir),))

    def classify(self, result: PhaseResult) -> HarnessExit:
        out = result.stdout.decode(errors="replace")
        text = out[-2000:] + result.stderr[-2000:].decode(errors="replace")
        try:
            summary = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        except (ValueError, IndexError):
            summary = {}
        if result.exit_code == 0 and not summary.get("is_error"):
            return HarnessExit("finished", str(summary.get("subtype", "")))
        low = text.lower()
        if "prompt is too long" in low or "context" in low and "exceed" in low:
            return HarnessExit("context_exceeded", text)
        if "connection error" in low or "econnrefused" in low or "unable to connect" in low:
            return HarnessExit("infra", text)
        if summary.get("subtype") == "error_max_turns":
            return HarnessExit("finished", "turn limit reached")
        return HarnessExit("error", f"exit code {result.exit_code}: {text}")
