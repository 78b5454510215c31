"""The rollout orchestrator: task folders, harness adapters, sandbox backends, verifiers, GRPO groups."""

from .backends import SandboxBackend, SandboxError, backend_names, get_backend
from .harnesses import HarnessAdapter, get_harness, harness_names
from .orchestrator import Orchestrator, RunConfig, RunSummary
from .task import Task, TaskError, load_task, load_tasks

__all__ = ["HarnessAdapter", "Orchestrator", "RunConfig", "RunSummary", "SandboxBackend", "SandboxError", "Task",
           "TaskError", "backend_names", "get_backend", "get_harness", "harness_names", "load_task", "load_tasks"]
