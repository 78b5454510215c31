"""The harness adapter interface: how to run one harness, unmodified, inside a sandbox against the proxy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .._backends.base import Mount, PhaseResult


class HarnessNotInstalled(RuntimeError):
    """The harness binary is missing; the message says how to install it."""


@dataclass(frozen=True)
class LaunchContext:
    """What an adapter gets to build its command line."""

    instruction: str
    base_url: str             # the proxy as seen from inside the sandbox, without /v1 (e.g. http://127.0.0.1:8000)
    token: str                # the rollout's scoped token: the harness's API key
    model: str                # the model name the harness should ask for
    workdir: str              # the workspace inside the sandbox
    home: str                 # a writable HOME inside the sandbox
    max_turns: int | None = None


@dataclass(frozen=True)
class Launch:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()                         # host installs made visible read-only
    files: tuple[tuple[str, bytes, int], ...] = ()         # config files written in the sandbox before launch


@dataclass(frozen=True)
class HarnessExit:
    """How the harness ended: ``finished`` (it says it is done), ``error`` (crashed / non-zero exit),
    ``context_exceeded`` (a harness error of its own kind), ``infra`` (it could not reach the proxy)."""

    kind: str
    detail: str = ""


@runtime_checkable
class HarnessAdapter(Protocol):
    """Registered by short name in ``rollout._harnesses`` (``react``, ``mini-swe-agent``, ``codex``, ``claude-code``)."""

    name: str

    def is_installed(self) -> bool: ...

    def install_hint(self) -> str:
        """The command that installs the harness, for the error a user sees when it is missing."""

    def version(self) -> str:
        """The installed version (recorded in the store's harness row)."""

    def launch(self, ctx: LaunchContext) -> Launch: ...

    def classify(self, result: PhaseResult) -> HarnessExit:
        """Tell from the harness phase's exit code and output whether it finished, crashed or hit its context."""
