"""Made-up names: file names a tool call's arguments hold that nothing the rollout had shown the model held.

A small policy that copies names wrong (``rocket_28.txt`` for the instruction's ``rocket_60.txt``) or carries one
over from another task fails while every other rubric reads as usual: the call is well-formed, it runs, and often
it does not even fail. The learning loop's ``check`` and ``recover`` failures were mostly of this kind (README,
2026-12-07), so this is what tells a version that copies better from one that looks more. The rule is in
:mod:`learner._rubrics`' docstring; the name pattern is :class:`learner._analysis_config.RubricConfig`'s
``name_patterns``. The JSON and text helpers the other rubrics share live here too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import orjson

from forge_store import CallSummary, StoredCall

from ._analysis_config import RubricConfig


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(p.get("text") if isinstance(p, dict) else p) for p in content)
    if isinstance(content, dict):
        return _text(content.get("text", json.dumps(content)))
    return str(content)


def _loads(raw):
    """``json.loads`` (orjson first: the arguments of a million tool calls; json for what orjson does not read)."""
    try:
        return orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return json.loads(raw)


def _strings(value, out: list[str]) -> list[str]:
    """Every string of a decoded JSON value, keys aside."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, out)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)
    return out


def names_in(text: str, config: RubricConfig) -> frozenset[str]:
    """The file names ``text`` holds (``name_patterns``)."""
    return frozenset(m.group(0) for pat in config.patterns("name_patterns") for m in pat.finditer(text))


def argument_texts(raw) -> list[str]:
    """The strings a tool call's arguments hold: decoded, or their raw text where they do not decode."""
    try:
        value = _loads(raw) if isinstance(raw, (str, bytes)) else raw
    except (TypeError, ValueError):
        value = raw
    return _strings(value, [])


def argument_names(raw, names_of) -> frozenset[str]:
    """The file names a tool call's arguments hold. ``names_of``: text -> names (``names_in``, or a cache of it)."""
    return frozenset().union(*map(names_of, argument_texts(raw)))


def message_texts(m: dict) -> list[str]:
    """The texts a message shows the model: its content and its tool calls' arguments."""
    out = [_text(m.get("content", m.get("text")))]
    for tc in m.get("tool_calls") or ():
        if isinstance(tc, dict):
            fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
            out += argument_texts(fn.get("arguments", fn.get("input")))
    return out


def made_up_names(ordered: Sequence[StoredCall | CallSummary], step_names: Sequence[Sequence[frozenset[str]]],
                  names_of) -> tuple[int, int]:
    """(names in tool calls, made-up ones) of a rollout's calls in order; ``step_names[i]``: the names of each tool
    call of call ``i``'s answer. A call's prompt shows it every message of its ``messages`` (``Store.calls``: the
    whole prompt; ``Store.call_summaries``: the messages new in it, so the union over the calls is the same).

    What was shown is scanned for names only when a tool call names one not seen yet: most names come from the
    instruction, so most tool results are never scanned. The counts are those of scanning everything first."""
    seen: set[str] = set()
    pending: list[str] = []   # texts shown and not scanned yet
    names = made_up = 0
    for c, own in zip(ordered, step_names):
        for m in c.messages:
            pending += message_texts(m)
        for found in own:
            names += len(found)
            if pending and not found <= seen:
                for text in pending:
                    seen |= names_of(text)
                pending = []
            made_up += len(found - seen)
        answer = c.response_message or c.response or {}
        pending.append(_text(answer.get("content", answer.get("text"))))
        seen.update(*own)   # its tool calls' names: the next calls' prompts show them
    return names, made_up
