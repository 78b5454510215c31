"""Fixtures for the orchestrator tests: a real store, an embedded proxy in front of the scripted upstream, and real
bubblewrap sandboxes under a folder the unprivileged sandbox user can enter (pytest's own tmp is 0700)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from forge_store import Settings, open_store
from openforge.embedded_proxy import EmbeddedProxy
from rollout import AdminClient
from rollout._backends.base import PhaseResult
from rollout._backends.local import LocalBackend
from rollout._harnesses import get_harness
from rollout._harnesses.base import HarnessExit, Launch, LaunchContext
from rollout._orchestrator import Orchestrator, RunConfig

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "tasks"


def require_bwrap() -> None:
    if shutil.which("bwrap") is None:
        msg = "bubblewrap is not installed: `make sandbox` (apt-get install -y bubblewrap)"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)


class CommandHarness:
    """A harness adapter that runs a fixed command (a crash, a hang, a tampering harness) in the sandbox."""

    name = "command"

    def __init__(self, *argv: str, env: dict | None = None):
        self.argv, self.env = argv, env or {}

    def is_installed(self) -> bool:
        return True

    def install_hint(self) -> str:
        return "nothing to install"

    def version(self) -> str:
        return "test"

    def config(self) -> dict:
        return {"argv": list(self.argv)}

    def launch(self, ctx: LaunchContext) -> Launch:
        return Launch(argv=self.argv, env={"OPENAI_API_KEY": ctx.token, "OPENAI_BASE_URL": ctx.base_url, **self.env})

    def classify(self, result: PhaseResult) -> HarnessExit:
        return HarnessExit("finished") if result.exit_code == 0 else HarnessExit("error", f"exit {result.exit_code}")


@pytest.fixture
def shared_tmp():
    """A temporary folder the sandbox user (nobody) can traverse, for sandboxes and hand-made tasks."""
    require_bwrap()
    d = Path(tempfile.mkdtemp(prefix="openforge-test-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@dataclass
class Forge:
    store: object
    proxy: EmbeddedProxy
    admin: AdminClient
    backend: LocalBackend
    up: object
    root: Path

    def orchestrator(self, harness, model: str = "mock-model", **cfg) -> Orchestrator:
        if isinstance(harness, str):
            harness = get_harness(harness)
        config = RunConfig(harness=harness.name, model=model, **({"group_size": 1, "concurrency": 1} | cfg))
        return Orchestrator(config, store=self.store, backend=self.backend, harness=harness, admin=self.admin)

    def run(self, tasks, harness, **cfg):
        summary = self.orchestrator(harness, **cfg).run(list(tasks))
        assert self.store.flush(30)
        return summary

    def sandboxes(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))


def make_forge(up, shared_tmp: Path, store_url: str | None = None) -> Forge:
    settings = Settings(home=shared_tmp / "home")
    store = open_store(store_url or f"sqlite:///{shared_tmp / 'store.sqlite'}", journal=True, name="run",
                       settings=settings.model_copy(update={"journal_fsync": False}))
    root = shared_tmp / "sandboxes"
    proxy = EmbeddedProxy(up.url, store=store, settings=settings, socket_path=shared_tmp / "proxy.sock")
    backend = LocalBackend(root, proxy_socket=shared_tmp / "proxy.sock")
    return Forge(store, proxy, AdminClient(proxy.url, proxy.admin_token), backend, up, root)


@pytest.fixture
def forge(up, shared_tmp):
    f = make_forge(up, shared_tmp)
    yield f
    f.admin.close()
    f.proxy.stop()
    f.store.close()


def write_task(root: Path, name: str, *, test_sh: str, toml: str = "", instruction: str = "Do the thing.",
               workspace: dict[str, str] | None = None, solve_sh: str | None = None) -> Path:
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "task.toml").write_text(toml)
    (d / "instruction.md").write_text(instruction)
    (d / "tests" / "test.sh").write_text(test_sh)
    for rel, text in (workspace or {}).items():
        p = d / "environment" / "workspace" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    if solve_sh is not None:
        (d / "solution").mkdir()
        (d / "solution" / "solve.sh").write_text(solve_sh)
    for p in [d, *d.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return d


# A verifier that passes when /workspace/answer.txt says "42".
ANSWER_TEST = """#!/bin/bash
mkdir -p "$OPENFORGE_REWARD_DIR"
cd "$OPENFORGE_WORKSPACE"   # the verifier starts in its own fresh HOME (docs/rollouts.md)
if [ "$(cat answer.txt 2>/dev/null)" = "42" ]; then r=1; else r=0; fi
echo "{\\"reward\\": $r, \\"checks\\": {\\"answer\\": $r}}" > "$OPENFORGE_REWARD_DIR/reward.json"
"""
