"""Adapter for mini-swe-agent (`mini`, tool calls over litellm -> the proxy's chat completions).

It runs from its own virtual environment under ``CACHE/mini-swe-agent`` (built with the system python3, so the
sandbox, which sees ``/usr`` only, can run it); the venv is mounted at the same path inside the sandbox.
"""

from __future__ import annotations

from pathlib import Path

from .._backends.base import Mount, PhaseResult
from .base import HarnessExit, Launch, LaunchContext

VERSION = "2.4.6"


class MiniSweAgentHarness:
    name = "mini-swe-agent"

    def __init__(self, *, cache_dir: Path, step_limit: int = 30):
        self.venv, self.step_limit = cache_dir / "mini-swe-agent", step_limit

    def is_installed(self) -> bool:
        return (self.venv / "bin" / "mini").exists()

    def install_hint(self) -> str:
        return (f"`make mini-swe-agent` (or: /usr/bin/python3 -m venv {self.venv} && "
                f"{self.venv}/bin/pip install mini-swe-agent=={VERSION})")

    def version(self) -> str:
        found = sorted(self.venv.glob("lib/python3*/site-packages/mini_swe_agent-*.dist-info"))
        return found[-1].name.removeprefix("mini_swe_agent-").removesuffix(".dist-info") if found else "unknown"

    def config(self) -> dict:
        return {"step_limit": self.step_limit}

    def launch(self, ctx: LaunchContext) -> Launch:
        venv = str(self.venv)
        argv = (f"{venv}/bin/mini", "-m", f"openai/{ctx.model}", "-t", ctx.instruction, "--yolo", "--exit-immediately",
                "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={ctx.base_url}/v1",
                "-c", "model.cost_tracking=ignore_errors",
                "-c", f"agent.step_limit={ctx.max_turns or self.step_limit}", "-c", "agent.cost_limit=0",
                "-c", f"environment.cwd={ctx.workdir}", "-o", f"{ctx.home}/trajectory.json")
        env = {"OPENAI_API_KEY": ctx.token, "MSWEA_CONFIGURED": "true", "MSWEA_SILENT_STARTUP": "1",
               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_GLOBAL_CONFIG_DIR": f"{ctx.home}/.mini",
               "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "3", "TERM": "dumb", "NO_COLOR": "1"}
        return Launch(argv=argv, env=env, mounts=(Mount(self.venv, venv),))

    def classify(self, result: PhaseResult) -> HarnessExit:
        text = (result.stdout[-3000:] + result.stderr[-3000:]).decode(errors="replace")
        low = text.lower()
        if "contextwindowexceeded" in low or "context length" in low:
            return HarnessExit("context_exceeded", text[-2000:])
        if "apiconnectionerror" in low or "connection refused" in low:
            return HarnessExit("infra", text[-2000:])
        if result.exit_code == 0:
            return HarnessExit("finished")
        return HarnessExit("error", f"exit code {result.exit_code}: {text[-2000:]}")
