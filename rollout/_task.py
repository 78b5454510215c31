"""The task format: one folder per task, close to Harbor / Terminal-Bench so their tasks run unchanged.

    my-task/
      task.toml            # Harbor's sections ([metadata] [agent] [verifier] [environment] [solution]) plus [task]
      instruction.md       # what the harness is asked to do
      environment/         # shown read-only at /environment; Dockerfile / image reference for container backends
        workspace/         # copied into the rollout's private workspace (/workspace)
      tests/test.sh        # the verifier: writes /logs/verifier/reward.txt (a number) or reward.json
      solution/solve.sh    # optional reference solution (the `oracle` harness runs it)
      solution/actions.json  # optional: the same solution as the react harness's tool calls, then the final
                             # answer: [{"tool": "bash", "arguments": {"command": "..."}}, ..., {"answer": "Done."}]

``[task]`` is OpenForge's: ``id`` (default: the folder name), ``domain`` (default: ``metadata.category``),
``required_tools`` and ``reference_steps`` (behaviour rubrics), ``pass_threshold`` (a reward at or above it is a
success; default 1.0). ``[[environment.services]]`` starts mock services inside the sandbox before the harness.
Unknown keys are errors (a typo must not silently change a timeout); ``[metadata]`` is free-form.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from forge_store import sha256_hex

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
TASK_FILE = "task.toml"
INSTRUCTION_FILE = "instruction.md"
VERIFIER_ENTRY = ("tests", "test.sh")
SOLUTION_ENTRY = ("solution", "solve.sh")
ACTIONS_ENTRY = ("solution", "actions.json")
_ACTIONS_EXAMPLE = '[{"tool": "bash", "arguments": {"command": "mv a.txt b.txt"}}, {"answer": "Done."}]'


class TaskError(ValueError):
    """A task folder that cannot be used; the message names the file, the field and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskSection(_Strict):
    id: str | None = Field(default=None, pattern=_ID.pattern)
    domain: str | None = None
    required_tools: list[str] = []
    reference_steps: int | None = Field(default=None, ge=1)
    pass_threshold: float = Field(default=1.0, ge=0.0, le=1.0)


class AgentSection(_Strict):
    timeout_sec: float = Field(default=600.0, gt=0)


class VerifierSection(_Strict):
    timeout_sec: float = Field(default=600.0, gt=0)
    env: dict[str, str] = {}


class Service(_Strict):
    name: str
    command: list[str]
    port: int | None = Field(default=None, ge=1, le=65535)
    ready_timeout_sec: float = Field(default=10.0, gt=0)
    env: dict[str, str] = {}

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return ["/bin/sh", "-c", v] if isinstance(v, str) else v


class EnvironmentSection(_Strict):
    docker_image: str | None = None
    build_timeout_sec: float = 600.0
    cpus: float = Field(default=1.0, gt=0)
    memory_mb: int = Field(default=2048, ge=16)
    storage_mb: int = Field(default=10240, ge=1)
    gpus: int = Field(default=0, ge=0)
    allow_internet: bool = False
    workdir: str = "/workspace"
    services: list[Service] = []

    @field_validator("services")
    @classmethod
    def _distinct(cls, v: list[Service]) -> list[Service]:
        for key in ("name", "port"):
            values = [getattr(s, key) for s in v if getattr(s, key) is not None]
            dup = sorted({x for x in values if values.count(x) > 1})
            if dup:
                raise ValueError(f"two services share the {key} {dup[0]!r}; each service needs its own {key}")
        return v

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/") or ".." in v.split("/"):
            raise ValueError("must be an absolute path without '..' (for example /workspace or /app)")
        return v


class SolutionSection(_Strict):
    env: dict[str, str] = {}


class TaskToml(_Strict):
    version: str = "1.0"
    task: TaskSection = TaskSection()
    metadata: dict[str, Any] = {}
    agent: AgentSection = AgentSection()
    verifier: VerifierSection = VerifierSection()
    environment: EnvironmentSection = EnvironmentSection()
    solution: SolutionSection = SolutionSection()


@dataclass(frozen=True)
class Task:
    id: str
    path: Path
    domain: str
    instruction: str
    config: TaskToml
    solution_actions: tuple[dict, ...] | None = None
    """The reference solution as tool calls (``{"tool", "arguments"}``) ending with ``{"answer": ...}``, from
    ``solution/actions.json`` (a scripted teacher replays it); None when the task has none."""

    @property
    def agent_timeout_s(self) -> float:
        return self.config.agent.timeout_sec

    @property
    def verifier_timeout_s(self) -> float:
        return self.config.verifier.timeout_sec

    @property
    def workspace_seed(self) -> Path | None:
        p = self.path / "environment" / "workspace"
        return p if p.is_dir() else None

    @property
    def environment_dir(self) -> Path | None:
        p = self.path / "environment"
        return p if p.is_dir() else None

    @property
    def tests_dir(self) -> Path:
        return self.path / VERIFIER_ENTRY[0]

    @property
    def solution_dir(self) -> Path | None:
        p = self.path / SOLUTION_ENTRY[0]
        return p if (p / SOLUTION_ENTRY[1]).is_file() else None

    @property
    def instruction_hash(self) -> str:
        return sha256_hex(self.instruction.encode())

    @property
    def verifier_hash(self) -> str:
        return _tree_hash(self.tests_dir)

    @property
    def environment_hash(self) -> str | None:
        return _tree_hash(self.environment_dir) if self.environment_dir else None

    def store_metadata(self) -> dict:
        """What the store's ``tasks.metadata`` keeps (behaviour rubrics read required_tools / reference_steps)."""
        c = self.config
        return {"required_tools": c.task.required_tools, "reference_steps": c.task.reference_steps,
                "pass_threshold": c.task.pass_threshold, "agent_timeout_s": c.agent.timeout_sec,
                "verifier_timeout_s": c.verifier.timeout_sec, "workdir": c.environment.workdir,
                "resources": {"cpus": c.environment.cpus, "memory_mb": c.environment.memory_mb,
                              "storage_mb": c.environment.storage_mb},
                "environment_hash": self.environment_hash, "services": [s.name for s in c.environment.services],
                "metadata": c.metadata}


def _tree_hash(root: Path) -> str:
    """sha256 over (relative path, mode bit x, bytes) of every file, sorted: the verifier / environment identity."""
    lines = []
    for p in sorted(root.rglob("*")):
        if p.is_file():
            rel = p.relative_to(root).as_posix()
            lines.append(f"{rel}\0{int(p.stat().st_mode & 0o111 != 0)}\0{sha256_hex(p.read_bytes())}")
    return sha256_hex("\n".join(lines).encode())


def load_task(path: str | Path) -> Task:
    """Load and check one task folder; every problem is a ``TaskError`` naming the file and the field."""
    root = Path(path)
    if not root.is_dir():
        raise TaskError(f"{root}: not a folder; a task is a folder with {TASK_FILE}, {INSTRUCTION_FILE} and "
                        f"tests/test.sh")
    toml_path = root / TASK_FILE
    if not toml_path.is_file():
        raise TaskError(f"{toml_path}: missing; every task folder needs a {TASK_FILE} (an empty file takes the "
                        f"defaults)")
    try:
        raw = tomllib.loads(toml_path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{toml_path}: not valid TOML ({exc}); fix the syntax") from None
    except UnicodeDecodeError:
        raise TaskError(f"{toml_path}: not UTF-8 text; save it as UTF-8") from None
    try:
        config = TaskToml.model_validate(raw)
    except ValidationError as exc:
        raise TaskError(_describe(toml_path, exc)) from None
    instruction_path = root / INSTRUCTION_FILE
    if not instruction_path.is_file():
        raise TaskError(f"{instruction_path}: missing; write the task's instruction for the harness there")
    try:
        instruction = instruction_path.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError as exc:
        raise TaskError(f"{instruction_path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") \
            from None
    if not instruction:
        raise TaskError(f"{instruction_path}: empty; the harness needs an instruction")
    verifier = root.joinpath(*VERIFIER_ENTRY)
    if not verifier.is_file():
        raise TaskError(f"{verifier}: missing; the verifier entry point writes /logs/verifier/reward.txt")
    task_id = config.task.id or root.resolve().name
    if not _ID.match(task_id):
        raise TaskError(f"{toml_path}: task id {task_id!r} (the folder name) is not a valid id ({_ID.pattern}); "
                        f"set [task] id or rename the folder")
    domain = config.task.domain or str(config.metadata.get("category") or "default")
    return Task(id=task_id, path=root.resolve(), domain=domain, instruction=instruction, config=config,
                solution_actions=_load_actions(root.joinpath(*ACTIONS_ENTRY)))


def _load_actions(path: Path) -> tuple[dict, ...] | None:
    """``solution/actions.json`` checked: a JSON list of tool calls, then exactly one final answer, last."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise TaskError(f"{path}: not valid UTF-8 JSON ({exc}); write a list like {_ACTIONS_EXAMPLE}") from None
    if not isinstance(doc, list) or not doc:
        raise TaskError(f"{path}: must be a non-empty JSON list of tool calls ending with the final answer, "
                        f"like {_ACTIONS_EXAMPLE}; found {type(doc).__name__} {str(doc)[:80]}")
    for i, item in enumerate(doc):
        last = i == len(doc) - 1
        problem = _action_problem(item, last)
        if problem:
            raise TaskError(f"{path}: item {i} ({json.dumps(item)[:120]}) {problem}; the list is tool calls then "
                            f"one answer, like {_ACTIONS_EXAMPLE}")
    return tuple(doc)


def _action_problem(item: Any, last: bool) -> str | None:
    if not isinstance(item, dict):
        return "is not an object"
    if last:
        if set(item) != {"answer"} or not isinstance(item["answer"], str):
            return "must be the final answer, {\"answer\": \"<text>\"}, and nothing else"
        return None
    if "answer" in item:
        return "is an answer before the end: the final answer comes last, once"
    if set(item) != {"tool", "arguments"}:
        return f"must have exactly the keys tool and arguments (has {', '.join(sorted(item)) or 'none'})"
    if not isinstance(item["tool"], str) or not item["tool"]:
        return "has a tool that is not a non-empty name"
    if not isinstance(item["arguments"], dict):
        return "has arguments that are not a JSON object"
    return None


def _describe(path: Path, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            problems.append(f"field `{field}` is not a known key; remove it or fix its spelling (known keys are "
                            f"listed in rollout/_task.py)")
        else:
            problems.append(f"field `{field}` = {err.get('input')!r}: {err['msg']}")
    return f"{path}: " + "; ".join(problems)


def load_tasks(path: str | Path) -> list[Task]:
    """A task folder, or a folder of task folders (each with a task.toml), in name order."""
    root = Path(path)
    if (root / TASK_FILE).is_file():
        return [load_task(root)]
    if not root.is_dir():
        raise TaskError(f"{root}: no such folder; pass a task folder or a folder of task folders")
    for p in sorted(root.iterdir()):
        if p.is_dir() and not (p / TASK_FILE).exists() and ((p / INSTRUCTION_FILE).exists() or (p / "tests").is_dir()):
            raise TaskError(f"{p}: looks like a task (it has {INSTRUCTION_FILE} or tests/) but has no {TASK_FILE}; "
                            f"add one (an empty file takes the defaults) or move the folder out of {root}")
    tasks = [load_task(p) for p in sorted(root.iterdir()) if p.is_dir() and (p / TASK_FILE).is_file()]
    if not tasks:
        raise TaskError(f"{root}: no task folders inside (none has a {TASK_FILE})")
    seen: dict[str, Path] = {}
    for t in tasks:
        if t.id in seen:
            raise TaskError(f"{t.path / TASK_FILE}: task id {t.id!r} is also used by {seen[t.id]}; ids must be unique")
        seen[t.id] = t.path
    return tasks
