"""Behaviour rubrics over stored trajectories: functions of one rollout's calls (pass@k / pass^k are in
:mod:`learner._stats`).

The rules (every list and pattern lives in :class:`learner._analysis_config.RubricConfig`):

* **Tool calls** come from each call's assistant message (``tool_calls``, OpenAI chat shape: every wire protocol
  is stored in that shape). A call's *tool result* is the ``role: "tool"`` message with the same ``tool_call_id``
  in any later prompt of the rollout.
* **Distribution / generic-shell share**: tool calls per name and per category; shell share = shell calls / all.
* **Format robustness**: a tool call is well-formed when its arguments parse as a JSON object, its tool is declared
  in the call's tool schema (``tool_schemas`` by ``tool_schema_hash``), and the arguments satisfy that tool's
  JSON Schema (required keys, ``type``, ``enum``, nested ``properties`` / ``items``). A tool declared without
  parameters (free-form) needs only to be named. Calls without a declared schema are checked for JSON only.
* **Error recovery**: a tool call *failed* when its result matches an ``error_patterns`` regex. It was *recovered*
  when the next tool call differs (name or arguments) and its own result is present and not an error. Rate =
  recovered / failed.
* **Self-verification** (rollouts that wrote at least one path): every path written (write tools' path
  arguments, ``apply_patch`` file headers, shell redirections / tee / ``sed -i`` / touch) was read back after its
  last write (a read or search tool on it, or a read-back shell command naming it), or a test run came after it.
* **Inspects first** (rollouts with a tool call): the first tool call only looks: a read or search tool, or a
  shell command that writes no path and matches no ``shell_change_patterns`` (``mv``, ``cp``, ``rm``, ``mkdir``, ...).
  A write tool or a service-specific one acts. What a program run from the shell does (``python x.py``) cannot be
  told from its command line and counts as a look.
* **Made-up names** (of the file names tool calls hold): a name (``name_patterns``: a last path component with an
  extension) in a tool call's arguments that nothing the rollout had shown the model before that answer holds (its
  prompts so far, every role, and its own earlier answers) is made up: a file name copied wrong, or one from another
  task. Names the model coins in one answer and reuses in later ones count once.
* **Unparsed tool calls**: answers with no tool call whose text holds tool-call markup (``unparsed_markers``): the
  server's parser could not read the call, and the turn ended on it (:mod:`learner._answers`).
* **Tool coverage**: share of the task's ``required_tools`` (tasks.metadata) called; a requirement may name a tool
  or a category (``shell``, ``read``, ...).
* **Step efficiency**: ``reference_steps`` (tasks.metadata) / model calls taken, capped at 1; the analysis tables
  average it over rollouts that passed (giving up early is not efficiency).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from forge_store import CallSummary, StoredCall

from ._analysis_config import READ, SEARCH, SHELL, WRITE, RubricConfig
from ._answers import unparsed_tool_call
from ._names import _loads, _text, argument_names, made_up_names, names_in

_PATCH_FILE = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+)$", re.M)
_PATCH_MOVE = re.compile(r"^\*\*\* Move to: (.+)$", re.M)


@dataclass(frozen=True)
class ToolStep:
    """One tool call of a rollout, with its result."""

    index: int
    call_id: str
    call_seq: int
    tool_call_id: str | None
    name: str
    category: str
    arguments_raw: str
    arguments: dict | None
    format_ok: bool
    format_problem: str | None
    result: str | None
    failed: bool


@dataclass(frozen=True)
class RolloutRubrics:
    """Every rubric of one rollout; None where a rubric does not apply (e.g. no writes, no reference steps)."""

    rollout_id: str | None
    n_calls: int
    n_tool_calls: int
    tool_counts: dict[str, int]
    category_counts: dict[str, int]
    shell_share: float | None
    format_ok: int
    failed: int
    recovered: int
    wrote: bool
    self_verified: bool | None
    coverage: float | None
    efficiency: float | None
    unparsed: int = 0   # answers holding a tool call the server's parser could not read
    inspected_first: bool | None = None   # the first tool call only looks (None: no tool call)
    names: int = 0      # file names in tool-call arguments (distinct within each call)
    made_up: int = 0    # of them, names nothing shown before held

    @property
    def made_up_rate(self) -> float | None:
        return self.made_up / self.names if self.names else None

    @property
    def format_rate(self) -> float | None:
        return self.format_ok / self.n_tool_calls if self.n_tool_calls else None

    @property
    def recovery_rate(self) -> float | None:
        return self.recovered / self.failed if self.failed else None


# ---- extraction ---------------------------------------------------------------------------------------------
def _assistant_tool_calls(call: StoredCall | CallSummary) -> list[dict]:
    msg = call.response_message or call.response or {}
    return [tc for tc in (msg.get("tool_calls") or []) if isinstance(tc, dict)]


def _declared(tools: list | None) -> dict[str, dict | None] | None:
    """Tool name -> parameters schema (None: free-form) of a request's tool list; None when it declared none."""
    if not tools:
        return None
    out: dict[str, dict | None] = {}
    for t in tools:
        if not isinstance(t, dict):
            continue
        fn = t.get("function") if isinstance(t.get("function"), dict) else t
        if fn.get("name"):
            out[fn["name"]] = fn.get("parameters", fn.get("input_schema"))
    return out


_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _type_ok(value, t: str) -> bool:
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or (isinstance(value, float) and value.is_integer())
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    py = _JSON_TYPES.get(t)
    return py is None or isinstance(value, py)


def schema_problem(value, schema: dict | None, where: str = "arguments") -> str | None:
    """The first way ``value`` breaks ``schema`` (a JSON Schema subset), or None."""
    if not isinstance(schema, dict):
        return None
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else list(types)
        if not any(_type_ok(value, t) for t in types):
            return f"{where} is {type(value).__name__}, schema wants {'|'.join(types)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} = {value!r} is not one of {schema['enum']}"
    if isinstance(value, dict):
        for key in schema.get("required") or ():
            if key not in value:
                return f"{where} lacks required key {key!r}"
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                problem = schema_problem(value[key], sub, f"{where}.{key}")
                if problem:
                    return problem
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = schema_problem(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    return None


def _check_format(name: str, raw, declared: dict | None) -> tuple[dict | None, str | None]:
    if isinstance(raw, dict):
        args = raw
    else:
        try:
            args = _loads(raw) if raw not in (None, "") else {}
        except (TypeError, ValueError):
            return None, "arguments are not valid JSON"
    if not isinstance(args, dict):
        return None, f"arguments are JSON {type(args).__name__}, not an object"
    if declared is not None:
        if name not in declared:
            return args, f"tool {name!r} is not declared in the call's tool schema"
        return args, schema_problem(args, declared[name])
    return args, None


def tool_results(ordered: Sequence[StoredCall | CallSummary]) -> dict[str, str]:
    """tool_call_id -> the text of its result: the first ``role: "tool"`` message answering it, in call order."""
    results: dict[str, str] = {}
    for c in ordered:
        for m in c.messages:
            if m.get("role") == "tool" and m.get("tool_call_id") is not None:
                results.setdefault(str(m["tool_call_id"]), _text(m.get("content")))
    return results


def tool_steps(calls: Sequence[StoredCall | CallSummary], config: RubricConfig | None = None) -> list[ToolStep]:
    """The rollout's tool calls in order, each with its format verdict and its result."""
    config = config or RubricConfig()
    ordered = sorted(calls, key=lambda c: (c.seq, c.id))
    results = tool_results(ordered)
    steps: list[ToolStep] = []
    declared_of: dict[int, dict | None] = {}  # calls of a rollout share one decoded tool list per schema
    for c in ordered:
        key = id(c.tools)
        if key not in declared_of:
            declared_of[key] = _declared(c.tools)
        declared = declared_of[key]
        for tc in _assistant_tool_calls(c):
            fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
            name = str(fn.get("name") or "")
            raw = fn.get("arguments", fn.get("input"))
            args, problem = _check_format(name, raw, declared)
            tcid = None if tc.get("id") is None else str(tc["id"])
            result = results.get(tcid) if tcid is not None else None
            steps.append(ToolStep(
                index=len(steps), call_id=c.id, call_seq=c.seq, tool_call_id=tcid, name=name,
                category=config.category(name), arguments_raw=raw if isinstance(raw, str) else json.dumps(raw),
                arguments=args, format_ok=problem is None, format_problem=problem, result=result,
                failed=result is not None and config.matches_any("error_patterns", result)))
    return steps


# ---- the rubrics ----------------------------------------------------------------------------------------------
def _norm_args(step: ToolStep) -> str:
    return json.dumps(step.arguments, sort_keys=True) if step.arguments is not None else step.arguments_raw.strip()


def error_recovery(steps: Sequence[ToolStep]) -> tuple[int, int]:
    """(failed tool calls, recovered ones): see the module docstring for the rule."""
    failed = recovered = 0
    for i, s in enumerate(steps):
        if not s.failed:
            continue
        failed += 1
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if nxt is None or (nxt.name == s.name and _norm_args(nxt) == _norm_args(s)):
            continue
        if nxt.result is not None and not nxt.failed:
            recovered += 1
    return failed, recovered


def _command(step: ToolStep, config: RubricConfig) -> str:
    args = step.arguments or {}
    for k in config.command_keys:
        v = args.get(k)
        if isinstance(v, list):
            return " ".join(map(str, v))
        if isinstance(v, str):
            return v
    return ""


def _norm_path(p: str) -> str:
    return os.path.normpath(p.strip().strip("'\""))


def _paths_written(step: ToolStep, config: RubricConfig) -> list[str]:
    args = step.arguments or {}
    if step.category == WRITE:
        paths = [args[k] for k in config.path_keys if isinstance(args.get(k), str)]
        patch = next((v for v in args.values() if isinstance(v, str) and "*** " in v), None)
        if patch is None and step.arguments is None and "*** " in step.arguments_raw:
            patch = step.arguments_raw
        if patch:
            paths += _PATCH_FILE.findall(patch) + _PATCH_MOVE.findall(patch)
        return [_norm_path(p) for p in paths]
    if step.category == SHELL:
        cmd = _command(step, config)
        out = []
        for pat in config.patterns("shell_write_patterns"):
            out += [_norm_path(m.group("path")) for m in pat.finditer(cmd) if "path" in pat.groupindex]
        return [p for p in out if p not in ("/dev/null", "&1", "&2")]
    return []


def _mentions(text: str, path: str) -> bool:
    base = os.path.basename(path)
    return path in text or bool(base and re.search(rf"(?<![\w.-]){re.escape(base)}(?![\w-])", text))


def self_verification(steps: Sequence[ToolStep], config: RubricConfig | None = None) -> bool | None:
    """True when every written path was read back (or tests ran) after its last write; None when nothing was written."""
    config = config or RubricConfig()
    pending: set[str] = set()
    wrote = False
    for s in steps:
        written = _paths_written(s, config)
        if s.category in (READ, SEARCH):
            args = s.arguments or {}
            for k in config.path_keys:
                if isinstance(args.get(k), str):
                    pending.discard(_norm_path(args[k]))
        elif s.category == SHELL:
            cmd = _command(s, config)
            if config.matches_any("test_run_patterns", cmd):
                pending.clear()
            elif config.matches_any("readback_patterns", cmd):
                pending -= {p for p in pending if p not in written and _mentions(cmd, p)}
        if written:
            wrote = True
            pending |= set(written)
    return (not pending) if wrote else None


def changes_state(step: ToolStep, config: RubricConfig) -> bool:
    """Whether a tool call acts (writes, moves, removes, installs...) rather than only looks: see "Inspects first"."""
    if step.category in (READ, SEARCH):
        return False
    if step.category != SHELL:
        return True
    if step.arguments is None:   # arguments that do not parse: their raw text is all there is to read
        raw = step.arguments_raw
        return config.matches_any("shell_change_patterns", raw) or config.matches_any("shell_write_patterns", raw)
    return bool(_paths_written(step, config)) or config.matches_any("shell_change_patterns", _command(step, config))


def tool_coverage(steps: Sequence[ToolStep], required: Sequence[str] | None) -> float | None:
    """Share of required tools (names or categories) called at least once; None when the task requires none."""
    if not required:
        return None
    names = {s.name for s in steps}
    cats = {s.category for s in steps}
    return sum(1 for r in required if r in names or r in cats) / len(required)


def step_efficiency(reference_steps: int | float | None, steps_taken: int) -> float | None:
    """reference_steps / steps taken, capped at 1; None without a reference or without steps."""
    if not reference_steps or steps_taken <= 0:
        return None
    return min(1.0, float(reference_steps) / steps_taken)


def rollout_rubrics(calls: Sequence[StoredCall | CallSummary], *, task_metadata: dict | None = None,
                    config: RubricConfig | None = None, rollout_id: str | None = None) -> RolloutRubrics:
    """Every rubric of one rollout from its calls (``Store.calls``, or the lighter ``Store.call_summaries``, which
    give the same answers) and its task's metadata."""
    config = config or RubricConfig()
    meta = task_metadata or {}
    steps = tool_steps(calls, config)
    failed, recovered = error_recovery(steps)
    verified = self_verification(steps, config)
    cats = Counter(s.category for s in steps)
    ordered = sorted(calls, key=lambda c: (c.seq, c.id))
    names_of = lambda text: names_in(text, config)  # noqa: E731
    names, made_up = made_up_names(ordered, [[argument_names(s.arguments_raw, names_of) for s in steps
                                              if s.call_id == c.id] for c in ordered], names_of)
    return RolloutRubrics(
        rollout_id=rollout_id if rollout_id is not None else (calls[0].rollout_id if calls else None),
        n_calls=len(calls), n_tool_calls=len(steps), tool_counts=dict(Counter(s.name for s in steps)),
        category_counts=dict(cats), shell_share=cats[SHELL] / len(steps) if steps else None,
        format_ok=sum(s.format_ok for s in steps), failed=failed, recovered=recovered, wrote=verified is not None,
        self_verified=verified, coverage=tool_coverage(steps, meta.get("required_tools")),
        efficiency=step_efficiency(meta.get("reference_steps"), len(calls)),
        unparsed=sum(unparsed_tool_call(c, config.unparsed_markers) for c in calls),
        inspected_first=not changes_state(steps[0], config) if steps else None, names=names, made_up=made_up)
