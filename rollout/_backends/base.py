"""The sandbox backend interface: what the orchestrator needs from a place that runs one rollout.

A sandbox is created from a ``SandboxSpec`` that declares, up front, every ``Phase`` the rollout will run
(services, harness, verifier). Declaring phases at creation lets a backend that cannot (or should not) exec into
a running sandbox bake them into its unit of work: the Kubernetes backend runs them as containers of one pod and
reads results from the pod's status, while the local backend runs each phase on demand inside one set of
namespaces. Either way the orchestrator calls ``run_phase`` once per phase, in order, and reads the phase's declared
output files from the returned ``PhaseResult``.

Paths inside a sandbox follow the Harbor / Terminal-Bench conventions so such tasks run unchanged:

- the workspace (seeded from the task's ``environment/workspace/``) at ``spec.workdir`` (default ``/workspace``);
- the task's ``environment/`` folder read-only at ``/environment`` (mock services, fixtures);
- the task's ``tests/`` read-only at ``/tests``, present only during the verifier phase;
- the verifier's output folder at ``/logs/verifier`` (``reward.txt`` or ``reward.json``);
- the task's ``solution/`` read-only at ``/solution``, present only for the ``oracle`` harness;
- the proxy at ``backend.proxy_url()`` (local: ``http://127.0.0.1:8000`` inside the sandbox's own network namespace).

A ``clean`` phase (the verifier) is what rewards rest on, so every backend runs it the same way: only after every
process of the earlier phases is gone (task services excepted), with exactly ``verifier_env`` (nothing inherited),
a HOME and TMPDIR made empty after the harness died (its cwd is that HOME), the workspace read-only where the backend
can enforce it, and its writable output folder emptied just before it starts and read right after it (and every
process it started) ended, from the backend's own side, never through a link.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

WORKDIR = "/workspace"
ENVIRONMENT_DIR = "/environment"
TESTS_DIR = "/tests"
SOLUTION_DIR = "/solution"
VERIFIER_LOGS = "/logs/verifier"
HARNESS_DIR = "/opt/openforge"
PROXY_PORT = 8000

# The verifier's environment, the same on every backend: these, then HOME / TMPDIR / OPENFORGE_WORKSPACE from
# ``verifier_env``, then the task's own ``[verifier] env``. No user site-packages, no script folder (or cwd) on
# sys.path, no bytecode written next to what it imports: a harness cannot plant code a naive ``python3 -`` picks up.
VERIFIER_ENV_BASE: dict[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin", "USER": "agent", "LOGNAME": "agent", "LANG": "C.UTF-8",
    "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1", "PYTHONDONTWRITEBYTECODE": "1",
    "OPENFORGE_TESTS": TESTS_DIR, "OPENFORGE_ENVIRONMENT": ENVIRONMENT_DIR, "OPENFORGE_REWARD_DIR": VERIFIER_LOGS,
}


def verifier_env(*, workdir: str, home: str, tmpdir: str, task_env: dict[str, str]) -> dict[str, str]:
    """The complete environment of a ``clean`` phase: ``VERIFIER_ENV_BASE``, the fresh ``home`` and ``tmpdir`` the
    backend made after the harness died, the workspace, then the task's ``[verifier] env`` (the task author's, so
    it may override any of these)."""
    return {**VERIFIER_ENV_BASE, "HOME": home, "TMPDIR": tmpdir, "OPENFORGE_WORKSPACE": workdir, **task_env}


class SandboxError(Exception):
    """A sandbox could not be created, lost, or misbehaved: an infrastructure error, never a reward."""

    def __init__(self, message: str, *, kind: str = "sandbox_lost"):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Mount:
    """A host path made visible inside the sandbox (local backend) or shipped with the pod (container backends)."""

    source: Path | None          # None: an empty folder (a phase's output folder, e.g. /logs/verifier)
    target: str
    writable: bool = False


@dataclass(frozen=True)
class Phase:
    """One step of a rollout inside its sandbox.

    ``background`` phases (mock services) are started and left running; ``ready_port`` makes ``run_phase`` wait until
    something listens there. ``mounts`` are visible only while this phase runs (tests for the verifier, the solution
    for the oracle). ``outputs`` are files (absolute sandbox paths) the backend hands back in ``PhaseResult.outputs``.
    ``clean`` marks the verifier: run as the module docstring says (``verifier_env``, fresh HOME, nothing left of
    the earlier phases), its outputs read only as regular files (``PhaseResult.refused`` names the others).
    """

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    cwd: str | None = None
    background: bool = False
    ready_port: int | None = None
    mounts: tuple[Mount, ...] = ()
    outputs: tuple[str, ...] = ()
    files: tuple[tuple[str, bytes, int], ...] = ()   # (absolute path, bytes, mode) written before the phase starts
    clean: bool = False


@dataclass(frozen=True)
class Resources:
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a backend needs to create one rollout's sandbox."""

    rollout_id: str
    run_id: str
    group_id: str
    task_id: str
    workspace_seed: Path | None          # host folder copied into the workspace (task environment/workspace)
    environment_dir: Path | None         # host folder shown read-only at /environment
    phases: tuple[Phase, ...]
    image: str | None = None             # container image reference (container backends)
    workdir: str = WORKDIR
    resources: Resources = Resources()
    mounts: tuple[Mount, ...] = ()       # visible in every phase (harness binaries, read-only)
    proxy_token: str | None = None       # the rollout's scoped token (a Secret on Kubernetes, never a literal)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class PhaseResult:
    name: str
    exit_code: int | None                # None: killed at the deadline or by cancellation
    timed_out: bool = False
    cancelled: bool = False
    duration_s: float = 0.0
    stdout: bytes = b""
    stderr: bytes = b""
    outputs: dict[str, bytes] = field(default_factory=dict)   # declared outputs that exist
    services: dict[str, bool] = field(default_factory=dict)   # background phases still running when it ended
    refused: dict[str, str] = field(default_factory=dict)     # declared outputs not read: a link, not a file; why
    strays_left: list[str] = field(default_factory=list)      # processes the end-of-phase kill could not end


@dataclass
class Sandbox:
    """A handle; ``backend_state`` is private to the backend that made it."""

    id: str
    spec: SandboxSpec
    backend: str
    created_at: float
    started_ms: float = 0.0              # create() wall time until the sandbox could run a phase
    backend_state: dict = field(default_factory=dict)


@runtime_checkable
class SandboxBackend(Protocol):
    """Registered by short name in ``rollout._backends`` (``local``, ``kubernetes``)."""

    name: str

    def proxy_url(self) -> str:
        """The proxy's base URL (no /v1) as a harness inside this backend's sandboxes reaches it."""

    def create(self, spec: SandboxSpec) -> Sandbox:
        """Start the sandbox; raise ``SandboxError`` (an infra error) if it cannot be started."""

    def run_phase(self, sandbox: Sandbox, phase: Phase, *, cancel: threading.Event | None = None) -> PhaseResult:
        """Run one of ``sandbox.spec.phases`` to completion, its deadline, or ``cancel``; never raises for a
        non-zero exit. Raises ``SandboxError`` when the sandbox itself is gone."""

    def exec(self, sandbox: Sandbox, argv: list[str], *, timeout_s: float = 60.0,
             env: dict[str, str] | None = None) -> PhaseResult:
        """An ad-hoc command in a running sandbox (debugging, tests). Not on the hot path."""

    def put_file(self, sandbox: Sandbox, path: str, data: bytes, mode: int = 0o644) -> None: ...

    def get_file(self, sandbox: Sandbox, path: str) -> bytes: ...

    def logs(self, sandbox: Sandbox) -> str:
        """What the sandbox printed outside phases (backend diagnostics, service output)."""

    def events(self, sandbox: Sandbox) -> list[dict]:
        """What the platform reported about the sandbox (pod events), each with time, reason, message, source."""

    def describe(self, sandbox: Sandbox) -> dict:
        """Facts for the lineage store: image_ref, image_digest, node, pod / pid, backend version."""

    def destroy(self, sandbox: Sandbox) -> None:
        """Stop everything in the sandbox and remove it. Idempotent; safe on a half-created sandbox."""

    def reap(self, *, run_id: str | None = None) -> list[str]:
        """Remove sandboxes this backend left behind (a crashed orchestrator); returns what was removed."""
