"""The text of a call that full-text search sees (``call_search.body``).

A call's text is what it adds to the rollout: the prompt messages that are not in its delta base (``prompt_tail``:
the user's new message, the tool results of the last turn, or the whole prompt of a call that starts a new segment),
its answer (text, reasoning, every tool call's name and arguments as the model wrote them) and its error. Stored
once per call, so a rollout's index grows with its new content, not with its turns squared (invariant 3).

Every string of a message is taken but ids, roles and types, and inline images (``data:`` URLs, blob references):
the shapes of OpenAI's and Anthropic's messages differ, and a search must not miss text in a part it does not know.
A call's text is cut at ``MAX_CHARS`` characters (the index is derived data; the call keeps every byte).
Migration 0006 carries a copy of these rules to index the calls stored before it (migrations import nothing of the
store); change both together.
"""

from __future__ import annotations

import json

MAX_CHARS = 200_000
_SKIP_KEYS = frozenset({"role", "type", "id", "tool_call_id", "call_id", "index", "media_type", "detail",
                        "mime_type", "format", "cache_control"})
_SKIP_PREFIXES = ("data:", "openforge-blob:")


def _strings(value, out: list[str]) -> None:
    if isinstance(value, str):
        if value and not value.startswith(_SKIP_PREFIXES):
            out.append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k not in _SKIP_KEYS:
                _strings(v, out)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)


def message_text(message) -> str:
    """The searchable strings of one message (a dict, or its canonical JSON body), one per line."""
    if isinstance(message, (str, bytes)):
        try:
            message = json.loads(message)
        except ValueError:
            return str(message)
    out: list[str] = []
    _strings(message, out)
    return "\n".join(out)


def call_text(prompt_bodies: list, answer, error: str | None = None) -> str:
    """The text of one call: its new prompt messages (dicts or JSON bodies), its answer message and its error."""
    parts = [message_text(m) for m in prompt_bodies]
    if answer is not None:
        parts.append(message_text(answer))
    if error:
        parts.append(error)
    return "\n".join(p for p in parts if p)[:MAX_CHARS]
