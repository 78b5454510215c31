"""The rubrics of many rollouts with each distinct value's work done once: :class:`RubricCache`.

:func:`learner._rubrics.rollout_rubrics` builds a :class:`ToolStep` per tool call and parses, validates and
pattern-matches each one. Over a store the same values come back again and again (the same arguments string under
the same tool schema, the same shell command, the same tool result), so :meth:`RubricCache.rubrics` asks the very
same functions of :mod:`learner._rubrics` once per distinct value and keeps the verdict: what a tool call's
arguments mean for every rubric (:class:`_Call`: format, category, paths written and read back, test runs) by
(tool schema, tool name, arguments), whether a result signals an error by its text, whether a command names a path.
The answers are those of ``rollout_rubrics`` (a test pins the two together); the caches are bounded (cleared when
full) and live for one analysis, never across runs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from forge_store import CallSummary

from ._analysis_config import READ, SEARCH, SHELL, RubricConfig
from ._answers import unparsed_tool_call
from ._names import argument_names, made_up_names, names_in
from ._rubrics import (
    RolloutRubrics,
    ToolStep,
    _assistant_tool_calls,
    _check_format,
    _command,
    _declared,
    _mentions,
    _norm_args,
    _norm_path,
    _paths_written,
    changes_state,
    step_efficiency,
    tool_coverage,
    tool_results,
)


@dataclass(frozen=True, slots=True)
class _Call:
    """What one tool call's name and arguments mean for the rubrics (its result aside)."""

    name: str
    category: str
    format_ok: bool
    norm_args: str  # what error recovery compares (learner._rubrics._norm_args)
    written: tuple[str, ...]  # paths it writes
    read: tuple[str, ...]  # paths a read / search tool names (self-verification)
    test_run: bool  # a shell command that runs tests
    readback: bool  # a shell command that reads paths back
    command: str
    changes: bool  # it acts rather than only looks (learner._rubrics.changes_state)
    names: frozenset[str]  # the file names its arguments hold (learner._names.argument_names)


class _Memo(dict):
    """A dict that forgets everything when it holds ``max_entries`` keys or ``max_chars`` characters of them (a
    tool result or an arguments string can be a whole file); a value too big for a sixteenth of that is not kept."""

    def __init__(self, max_entries: int, max_chars: int):
        super().__init__()
        self.max_entries, self.max_chars, self.chars = max_entries, max_chars, 0

    def put(self, key, value, chars: int):
        if chars * 16 > self.max_chars:
            return value
        if len(self) >= self.max_entries or self.chars + chars > self.max_chars:
            self.clear()
            self.chars = 0
        self[key] = value
        self.chars += chars
        return value


class RubricCache:
    """Per-distinct-value verdicts for :meth:`rubrics`; one per analysis (one ``RubricConfig``). Each memo holds
    at most ``max_entries`` values and ``max_chars`` characters of keys."""

    def __init__(self, config: RubricConfig, max_entries: int = 50_000, max_chars: int = 4_000_000):
        self.config = config
        self._declared: dict[str, dict | None] = {}  # by schema hash: a store has few
        self._calls = _Memo(max_entries, max_chars)
        self._failed = _Memo(max_entries, max_chars)
        self._mentions = _Memo(max_entries, max_chars)
        self._names = _Memo(max_entries, max_chars)

    def declared(self, call: CallSummary) -> dict | None:
        h = call.tool_schema_hash
        if h is None or call.tools is None:  # nothing to key a schema by: decode it for this call
            return _declared(call.tools)
        if h not in self._declared:
            self._declared[h] = _declared(call.tools)
        return self._declared[h]

    def call(self, schema: str | None, declared: dict | None, name: str, raw) -> _Call:
        key = (schema, name, raw) if isinstance(raw, str) and (schema is not None or declared is None) else None
        got = self._calls.get(key) if key is not None else None
        if got is None:
            got = self._new_call(declared, name, raw)
            if key is not None:  # the verdict holds the arguments about twice more (parsed, normalised)
                self._calls.put(key, got, 3 * len(raw))
        return got

    def _new_call(self, declared: dict | None, name: str, raw) -> _Call:
        config = self.config
        args, problem = _check_format(name, raw, declared)
        step = ToolStep(index=0, call_id="", call_seq=0, tool_call_id=None, name=name, category=config.category(name),
                        arguments_raw=raw if isinstance(raw, str) else json.dumps(raw), arguments=args,
                        format_ok=problem is None, format_problem=problem, result=None, failed=False)
        a = args or {}
        shell = step.category == SHELL
        command = _command(step, config) if shell else ""
        return _Call(name=name, category=step.category, format_ok=step.format_ok, norm_args=_norm_args(step),
                     written=tuple(_paths_written(step, config)),
                     read=tuple(_norm_path(a[k]) for k in config.path_keys if isinstance(a.get(k), str))
                     if step.category in (READ, SEARCH) else (),
                     test_run=shell and config.matches_any("test_run_patterns", command),
                     readback=shell and config.matches_any("readback_patterns", command), command=command,
                     changes=changes_state(step, config), names=argument_names(raw, self.names))

    def failed(self, result: str) -> bool:
        got = self._failed.get(result)
        if got is None:
            got = self._failed.put(result, self.config.matches_any("error_patterns", result), len(result))
        return got

    def names(self, text: str) -> frozenset[str]:
        got = self._names.get(text)
        if got is None:
            got = self._names.put(text, names_in(text, self.config), len(text))
        return got

    def mentions(self, command: str, path: str) -> bool:
        key = (command, path)
        got = self._mentions.get(key)
        if got is None:
            got = self._mentions.put(key, _mentions(command, path), len(command) + len(path))
        return got

    def rubrics(self, calls: Sequence[CallSummary], *, task_metadata: dict | None = None,
                rollout_id: str | None = None) -> RolloutRubrics:
        """``rollout_rubrics(calls, task_metadata=..., config=..., rollout_id=...)``, by the cached verdicts."""
        meta = task_metadata or {}
        ordered = sorted(calls, key=lambda c: (c.seq, c.id))
        results = tool_results(ordered)
        steps: list[tuple[_Call, bool, bool]] = []  # (call, has a result, failed)
        names: list[list[frozenset[str]]] = []  # each call's tool calls' names
        for c in ordered:
            tcs = _assistant_tool_calls(c)
            names.append([])
            if not tcs:
                continue
            declared = self.declared(c)
            for tc in tcs:
                fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
                name = str(fn.get("name") or "")
                step = self.call(c.tool_schema_hash, declared, name, fn.get("arguments", fn.get("input")))
                result = results.get(str(tc["id"])) if tc.get("id") is not None else None
                steps.append((step, result is not None, result is not None and self.failed(result)))
                names[-1].append(step.names)
        failed, recovered = self._recovery(steps)
        verified = self._verified(steps)
        cats = Counter(s.category for s, _, _ in steps)
        n = len(steps)
        named, made_up = made_up_names(ordered, names, self.names)
        return RolloutRubrics(
            rollout_id=rollout_id if rollout_id is not None else (calls[0].rollout_id if calls else None),
            n_calls=len(calls), n_tool_calls=n, tool_counts=dict(Counter(s.name for s, _, _ in steps)),
            category_counts=dict(cats), shell_share=cats[SHELL] / n if n else None,
            format_ok=sum(s.format_ok for s, _, _ in steps), failed=failed, recovered=recovered,
            wrote=verified is not None, self_verified=verified,
            coverage=tool_coverage([s for s, _, _ in steps], meta.get("required_tools")),
            efficiency=step_efficiency(meta.get("reference_steps"), len(calls)),
            unparsed=sum(unparsed_tool_call(c, self.config.unparsed_markers) for c in calls),
            inspected_first=not steps[0][0].changes if steps else None, names=named, made_up=made_up)

    @staticmethod
    def _recovery(steps: list[tuple[_Call, bool, bool]]) -> tuple[int, int]:
        """learner._rubrics.error_recovery over cached verdicts."""
        failed = recovered = 0
        for i, (s, _, bad) in enumerate(steps):
            if not bad:
                continue
            failed += 1
            if i + 1 == len(steps):
                continue
            nxt, has_result, nxt_bad = steps[i + 1]
            if nxt.name == s.name and nxt.norm_args == s.norm_args:
                continue
            if has_result and not nxt_bad:
                recovered += 1
        return failed, recovered

    def _verified(self, steps: list[tuple[_Call, bool, bool]]) -> bool | None:
        """learner._rubrics.self_verification over cached verdicts."""
        pending: set[str] = set()
        wrote = False
        for s, _, _ in steps:
            if s.category in (READ, SEARCH):
                for p in s.read:
                    pending.discard(p)
            elif s.category == SHELL:
                if s.test_run:
                    pending.clear()
                elif s.readback:
                    pending -= {p for p in pending if p not in s.written and self.mentions(s.command, p)}
            if s.written:
                wrote = True
                pending |= set(s.written)
        return (not pending) if wrote else None
