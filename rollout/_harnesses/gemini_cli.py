"""Adapter for Gemini CLI (``gemini -p``: one headless session, Gemini API over SSE), pointed at the proxy by
``GOOGLE_GEMINI_BASE_URL``, so every call is a ``streamGenerateContent`` the proxy translates and records
token-exact.

The config is pinned in the sandbox's ``~/.gemini/settings.json``: the API-key auth type (the CLI's own "gateway"
type, which ``GOOGLE_GEMINI_BASE_URL`` alone selects, is refused by its headless auth check in 0.61, "Invalid auth
method selected."; with ``gemini-api-key`` it still takes the base URL from that variable), the rollout token as
``GEMINI_API_KEY`` (sent as ``x-goog-api-key``), and no other endpoint: usage statistics (Clearcut), telemetry and
auto-update off. ``-m`` names the model, so the CLI skips its model-routing call; loop detection and the next-speaker
check (extra model calls of the CLI's own) are off. Folder trust is off so that ``--yolo`` holds in the sandbox's
workspace.
"""

from __future__ import annotations

import json
from pathlib import Path

from .._backends.base import PhaseResult
from . import npm
from .base import HarnessExit, Launch, LaunchContext

PACKAGE = "@google/gemini-cli"


def settings(max_turns: int) -> dict:
    """The pinned ``settings.json`` (see the module docstring)."""
    return {"security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
            "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "model": {"maxSessionTurns": max_turns, "disableLoopDetection": True, "skipNextSpeakerCheck": True}}


class GeminiCliHarness:
    name = "gemini-cli"

    def __init__(self, *, cache_dir: Path, max_turns: int = 60):
        self.cache_dir, self.max_turns = cache_dir, max_turns

    def is_installed(self) -> bool:
        return npm.node_installed() and (npm.npm_dir(self.cache_dir) / "node_modules" / ".bin" / "gemini").exists()

    def install_hint(self) -> str:
        return npm.install_hint(self.cache_dir)

    def version(self) -> str:
        return npm.package_version(self.cache_dir, PACKAGE) or "unknown"

    def config(self) -> dict:
        return {"max_turns": self.max_turns}

    def launch(self, ctx: LaunchContext) -> Launch:
        argv = (f"{npm.MOUNT}/node_modules/.bin/gemini", "-p", ctx.instruction, "-m", ctx.model, "--yolo",
                "--output-format", "json")
        env = {"GOOGLE_GEMINI_BASE_URL": ctx.base_url, "GEMINI_API_KEY": ctx.token, "GEMINI_CLI_NO_RELAUNCH": "true"}
        config = json.dumps(settings(ctx.max_turns or self.max_turns), indent=2).encode()
        return Launch(argv=argv, env=env, mounts=(npm.mount(self.cache_dir),),
                      files=((f"{ctx.home}/.gemini/settings.json", config, 0o600),))

    def classify(self, result: PhaseResult) -> HarnessExit:
        out = result.stdout.decode(errors="replace")
        text = out[-2000:] + result.stderr[-2000:].decode(errors="replace")
        try:
            summary = json.loads(out[out.index("{"):]) if "{" in out else {}
        except ValueError:
            summary = {}
        error = summary.get("error") if isinstance(summary, dict) else None
        if result.exit_code == 0 and not error:
            return HarnessExit("finished")
        low = text.lower()
        if "token count" in low and "exceeds" in low or "context window" in low or "too long" in low:
            return HarnessExit("context_exceeded", text)
        if "econnrefused" in low or "fetch failed" in low or "socket hang up" in low:
            return HarnessExit("infra", text)
        if "maximum session turns exceeded" in low or "reached max session turns" in low:
            return HarnessExit("finished", "turn limit reached")
        return HarnessExit("error", f"exit code {result.exit_code}: {text}")
