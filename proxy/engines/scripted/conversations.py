"""Scripts per conversation, for a scripted engine that plays a whole agent episode: a teacher, for instance.

A `Script` answers requests in the order they come. An agent harness runs many conversations at once, each a loop of
requests that grow turn by turn, so a teacher needs the next step *of that conversation*: `Conversations` picks the
script by the conversation's first user message that names one (the task instruction, as a harness sends it) and the
step by the number of assistant turns already in the prompt. So every turn of every rollout gets its own step, in any
interleaving, and a retried request gets the same answer again.

    teacher = Conversations({task.instruction: steps_from_actions(task.solution_actions) for task in tasks})
    upstream = ScriptedUpstream(conversations=teacher)

A conversation the scripts do not know, or one that goes on past its script's last step, is answered with an HTTP
error the harness sees (404: not retried, and the rollout ends as the harness reports it), never with made-up text.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .script import HTTPError, Step, Text, ToolCall, ToolCalls, step_from_dict
from .tokenizer import message_text

__all__ = ["Conversations", "conversations_from_json", "first_user_text", "steps_from_actions"]

_PREVIEW = 120


def first_user_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The text of the first user message (stripped), or None when there is none."""
    for m in messages:
        if m.get("role") == "user":
            return message_text(m.get("content")).strip()
    return None


def steps_from_actions(actions: Sequence[Mapping[str, Any]]) -> list[Step]:
    """A task's reference solution (``solution/actions.json``: tool calls in order, then the final answer) as steps:
    one tool call per turn, then the answer as text.

        [{"tool": "bash", "arguments": {"command": "mv a.txt b.txt"}}, {"answer": "Done."}]
    """
    if not actions:
        raise ValueError("an actions list needs at least the final answer, e.g. [{\"answer\": \"Done.\"}]")
    steps: list[Step] = []
    for i, action in enumerate(actions):
        last = i == len(actions) - 1
        if not isinstance(action, Mapping):
            raise ValueError(f"action {i} is {action!r}: each action is a dict, {{\"tool\": ..., \"arguments\": "
                             "{...}} or {\"answer\": ...}")
        extra = set(action) - ({"answer"} if "answer" in action else {"tool", "arguments"})
        if extra or ("answer" in action) == ("tool" in action):
            raise ValueError(f"action {i} is {dict(action)!r}: write either {{\"tool\": NAME, \"arguments\": "
                             "{...}} or {\"answer\": TEXT}, with no other keys")
        if "answer" in action:
            if not last:
                raise ValueError(f"action {i} is the answer, but {len(actions) - 1 - i} action(s) follow it: the "
                                 "answer ends the episode, so it goes last")
            if not isinstance(action["answer"], str):
                raise ValueError(f"action {i}'s answer is {action['answer']!r}: write it as a string")
            steps.append(Text(action["answer"]))
            continue
        if last:
            raise ValueError(f"the last action is a tool call ({action['tool']!r}): end the list with the final "
                             "answer, e.g. {\"answer\": \"Done.\"}")
        arguments = action.get("arguments", {})
        if not isinstance(action["tool"], str) or not isinstance(arguments, Mapping):
            raise ValueError(f"action {i} is {dict(action)!r}: the tool is a name (string), its arguments a dict")
        steps.append(ToolCalls([ToolCall(action["tool"], dict(arguments))]))
    return steps


def conversations_from_json(data: Any) -> dict[str, list[Step]]:
    """``{first user message: steps}`` from JSON, where each value is a list of steps (``{"text": ...}``,
    ``{"tool_calls": [...]}``) or a reference solution in ``actions.json``'s form (``{"tool": ...}``, ``{"answer":
    ...}``)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"conversations come as a JSON object {{first user message: [steps]}}, not {type(data).__name__}")
    out = {}
    for key, steps in data.items():
        if not isinstance(steps, list):
            raise ValueError(f"conversation {key[:_PREVIEW]!r}: its steps are a list, not {type(steps).__name__}")
        actions = all(isinstance(s, Mapping) and ("tool" in s or "answer" in s) for s in steps)
        out[key] = steps_from_actions(steps) if actions else [step_from_dict(s) for s in steps]
    return out


class Conversations:
    """Per-conversation scripts, keyed by the conversation's instruction (its first user message, as a rule).

    A request's conversation is the script whose key equals one of its user messages (stripped), or else the longest
    key that occurs in it (a harness may wrap the instruction in its own words); the first user message that names a
    script decides. Its step is the one at the number
    of assistant messages already in the prompt. Steps are `Text` or `ToolCalls` (or dicts of `step_from_dict`'s
    form); `match` and `times` do not apply here."""

    def __init__(self, scripts: Mapping[str, Iterable[Mapping[str, Any] | Step]] | None = None) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Step]] = {}
        for key, steps in (scripts or {}).items():
            self.add(key, steps)

    def add(self, key: str, steps: Iterable[Mapping[str, Any] | Step]) -> None:
        """Script the conversation whose first user message is ``key`` (replacing an earlier script for it)."""
        parsed = [step_from_dict(s) for s in steps]
        bad = [type(s).__name__ for s in parsed if not isinstance(s, (Text, ToolCalls))]
        if bad:
            raise ValueError(f"a conversation's steps are Text or ToolCalls, not {', '.join(bad)}: put delays and "
                             "errors in the upstream's flat Script, which is asked first")
        if not key.strip() or not parsed:
            raise ValueError(f"conversation {key[:_PREVIEW]!r} needs a non-blank key and at least one step")
        with self._lock:
            self._scripts[key.strip()] = parsed

    def clear(self) -> None:
        with self._lock:
            self._scripts.clear()

    def __len__(self) -> int:
        return len(self._scripts)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.strip() in self._scripts

    def script_for(self, text: str) -> tuple[str, list[Step]] | None:
        """The (key, steps) of the conversation whose first user message is ``text``, or None."""
        with self._lock:
            if text in self._scripts:
                return text, self._scripts[text]
            hits = [k for k in self._scripts if k in text]
        if not hits:
            return None
        key = max(hits, key=len)
        return key, self._scripts[key]

    def find(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[Step]] | None:
        """The (key, steps) of the conversation ``messages`` belong to: the first user message that names a script.
        Usually the first user message; a harness that sends its own context first (Codex's environment context)
        gets its task's script from the message that holds the instruction."""
        for m in messages:
            if m.get("role") == "user":
                found = self.script_for(message_text(m.get("content")).strip())
                if found is not None:
                    return found
        return None

    def step_for(self, messages: Sequence[Mapping[str, Any]]) -> Step:
        """The next step of the conversation ``messages`` belong to, or a 404 `HTTPError` saying why there is none."""
        found = self.find(messages)
        if found is None:
            text = first_user_text(messages) or ""
            return HTTPError(404, f"the scripted engine has no script for this conversation (first user message: "
                                  f"{text[:_PREVIEW]!r}); it knows {len(self)} conversation(s). Add one with "
                                  "Conversations.add(instruction, steps).", type="NotFoundError")
        key, steps = found
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn >= len(steps):
            return HTTPError(404, f"the script for {key[:_PREVIEW]!r} has {len(steps)} step(s) and this conversation "
                                  f"already has {turn} assistant turn(s): the harness went on after the script's "
                                  "final answer.", type="NotFoundError")
        return steps[turn]
