"""Adapter for Codex CLI (`codex exec`, Responses API over SSE), pointed at the proxy through a config profile."""

from __future__ import annotations

from pathlib import Path

from .._backends.base import PhaseResult
from . import npm
from .base import HarnessExit, Launch, LaunchContext

PACKAGE = "@openai/codex"


class CodexHarness:
    name = "codex"

    def __init__(self, *, cache_dir: Path, extra_config: str = ""):
        self.cache_dir, self.extra_config = cache_dir, extra_config

    def is_installed(self) -> bool:
        return npm.node_installed() and (npm.npm_dir(self.cache_dir) / "node_modules" / ".bin" / "codex").exists()

    def install_hint(self) -> str:
        return npm.install_hint(self.cache_dir)

    def version(self) -> str:
        return npm.package_version(self.cache_dir, PACKAGE) or "unknown"

    def config(self) -> dict:
        return {"extra_config": self.extra_config}

    def launch(self, ctx: LaunchContext) -> Launch:
        codex_home = f"{ctx.home}/.codex"
        config = f"""model = "{ctx.model}"
model_provider = "openforge"
{self.extra_config}

[model_providers.openforge]
name = "OpenForge proxy"
base_url = "{ctx.base_url}/v1"
wire_api = "responses"
env_key = "OPENFORGE_ROLLOUT_TOKEN"
supports_websockets = false
request_max_retries = 2
stream_max_retries = 2
"""
        argv = (f"{npm.MOUNT}/node_modules/.bin/codex", "exec", "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", "-C", ctx.workdir, ctx.instruction)
        return Launch(argv=argv, env={"CODEX_HOME": codex_home, "OPENFORGE_ROLLOUT_TOKEN": ctx.token},
                      mounts=(npm.mount(self.cache_dir),),
                      files=((f"{codex_home}/config.toml", config.encode(), 0o600),))

    def classify(self, result: PhaseResult) -> HarnessExit:
        text = (result.stdout[-4000:] + result.stderr[-4000:]).decode(errors="replace")
        if result.exit_code == 0:
            return HarnessExit("finished")
        low = text.lower()
        if "context window" in low or "context_length" in low or "maximum context" in low:
            return HarnessExit("context_exceeded", text[-2000:])
        if "error sending request" in low or "connection refused" in low or "stream disconnected" in low:
            return HarnessExit("infra", text[-2000:])
        return HarnessExit("error", f"exit code {result.exit_code}: {text[-2000:]}")
