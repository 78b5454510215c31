"""The rollout orchestrator: task folders (and generators of them), harness adapters, sandbox backends, verifiers,
GRPO groups.

Everything another part (or the ``openforge`` roof) may use is here; the modules behind it are private.
"""

from ._backends import (
    Mount,
    Phase,
    PhaseResult,
    Resources,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
    backend_names,
    get_backend,
)
from ._backends.kubernetes import KubernetesConfig
from ._harnesses import HarnessAdapter, HarnessNotInstalled, get_harness, harness_names
from ._orchestrator import Orchestrator, RunConfig, RunSummary
from ._proxy_admin import AdminClient, ProxyUnavailable, SocketRelay, claim_socket, served_models
from ._task import Task, TaskError, load_task, load_tasks
from ._task_version import TaskVersion, diff_versions, task_version
from ._taskgen import TaskGenError, generate_tasks, task_families
from ._tasksets import Validation, validate_task
from ._cli import tasks_app

__all__ = ["AdminClient", "HarnessAdapter", "HarnessNotInstalled", "KubernetesConfig", "Mount", "Orchestrator",
           "Phase", "PhaseResult", "ProxyUnavailable", "Resources", "RunConfig", "RunSummary", "Sandbox",
           "SandboxBackend", "SandboxError", "SandboxSpec", "SocketRelay", "Task", "TaskError", "TaskGenError",
           "TaskVersion", "Validation", "backend_names", "claim_socket", "diff_versions", "generate_tasks",
           "get_backend", "get_harness", "harness_names", "load_task", "load_tasks", "served_models", "task_families",
           "task_version", "tasks_app", "validate_task"]
