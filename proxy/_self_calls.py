"""Calls a harness makes for itself (issue 32): titles, names, routing, loop and next-speaker checks, history
summaries. They are recorded like any call and marked, where the harness lets us tell, in the call's metadata as
``harness_self_call`` (its kind: ``title``, ``routing``, ``compaction``, ...), so that an export can leave them out
(the learner's default: their completion is not the harness's work on the task, so the task's reward says nothing of
it) or keep them (``openforge export --include-self-calls``).

How a self-call is told, first match wins (``self_call``):

1. **A request header**, from any client: ``X-OpenForge-Self-Call: <kind>`` (a wrapper, or an adapter whose harness
   lets it set headers on its utility calls). The kind is kept if it is a short word (``[a-z0-9_.-]``, up to 40),
   else recorded as ``other``.
2. **Codex CLI** (0.171) says it itself: its ``x-codex-turn-metadata`` header holds ``request_kind``, ``turn`` for the
   agent's own turns in the captured requests (anything else is marked with that kind), and Codex's source names its
   compaction sub-agent in ``x-openai-subagent: compact`` (not among the captured requests: a one-turn task never
   compacts).
3. **A prompt signature** known per harness (``SIGNATURES``): a fixed sentence the harness puts at the head of the
   system prompt or of the last user turn of that call, read from the harness's own bundle:
   - Claude Code (2.1.197): the session title ("Generate a concise, sentence-case title"), the session name
     ("Generate a short kebab-case name") and the compaction summary ("Your task is to create a detailed summary of
     the conversation so far"); its small fast model's name is not a signature here: the adapter pins one model.
   - Gemini CLI (0.61): the model router ("You are a specialized Task Routing AI", "You are a Task Routing AI"), loop
     detection ("You are a diagnostic agent that determines whether a conversational AI assistant is stuck"), the
     next-speaker check (the last user turn "Analyze *only* the content and structure of your immediately preceding
     response") and history compression ("distilling chat history into a structured XML <state_snapshot>"). The
     adapter turns the first three off, so a rollout through it meets only the last.
   - Codex CLI: its compaction prompt ("You are performing a CONTEXT CHECKPOINT COMPACTION"), for requests without
     the headers above.
   - OpenClaw (2026.9.6): none found in its bundle; its calls are recorded unmarked unless it sends the header.

Only the first ``HEAD`` characters of the system prompt and of the last user turn are read (a signature sits at the
head), so a call pays a few substring searches over at most 2 x ``HEAD`` characters. A signature quoted later in a
user's message does not mark a call; a harness that rewords its prompt stops being recognised (its calls are then
recorded unmarked, as before) until its signature is added here.
"""

from __future__ import annotations

import re

import orjson

HEADER = "x-openforge-self-call"
KEY = "harness_self_call"  # the call's metadata key
HEAD = 4000
_KIND = re.compile(r"[a-z0-9_.-]{1,40}")

# (kind, where: "system" or "user", the sentence)
SIGNATURES: tuple[tuple[str, str, str], ...] = (
    ("title", "system", "Generate a concise, sentence-case title"),                      # Claude Code
    ("title", "system", "Generate a short kebab-case name"),                             # Claude Code
    ("title", "user", "Generate a short kebab-case name"),
    ("compaction", "user", "Your task is to create a detailed summary of the conversation so far"),  # Claude Code
    ("compaction", "system", "Your task is to create a detailed summary of the conversation so far"),
    ("routing", "system", "You are a specialized Task Routing AI"),                      # Gemini CLI
    ("routing", "system", "You are a Task Routing AI"),                                  # Gemini CLI
    ("loop_detection", "system", "You are a diagnostic agent that determines whether a conversational AI assistant"),
    ("next_speaker", "user", "Analyze *only* the content and structure of your immediately preceding response"),
    ("compaction", "system", "distilling chat history into a structured XML <state_snapshot>"),  # Gemini CLI
    ("compaction", "user", "You are performing a CONTEXT CHECKPOINT COMPACTION"),        # Codex CLI
    ("compaction", "system", "You are performing a CONTEXT CHECKPOINT COMPACTION"),
)
_BY_PLACE = {place: tuple((k, s) for k, p, s in SIGNATURES if p == place) for place in ("system", "user")}


def from_headers(marked: str | None, codex_turn: str | None, subagent: str | None) -> str | None:
    """The kind the request's headers give (rules 1 and 2), or None."""
    if marked is not None:
        kind = marked.strip().lower()
        return kind if _KIND.fullmatch(kind) else "other"
    if codex_turn is not None:
        try:
            meta = orjson.loads(codex_turn)
        except orjson.JSONDecodeError:
            meta = None
        kind = meta.get("request_kind") if isinstance(meta, dict) else None
        if isinstance(kind, str) and kind != "turn":
            return kind if _KIND.fullmatch(kind) else "other"
    if subagent == "compact":
        return "compaction"
    return None


def _text(content) -> str:
    """A message's text, its first ``HEAD`` characters: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content[:HEAD]
    if isinstance(content, list):
        out, n = [], 0
        for part in content:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str):
                out.append(text[:HEAD - n])
                n += len(out[-1])
                if n >= HEAD:
                    break
        return "\n".join(out)
    return ""


def from_prompt(messages: list) -> str | None:
    """The kind a harness's known prompt signature gives (rule 3), or None. ``messages``: the upstream
    chat-completions messages of the call (every protocol's translation)."""
    if not messages:
        return None
    first = messages[0]
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        text = _text(first.get("content"))
        for kind, sentence in _BY_PLACE["system"]:
            if sentence in text:
                return kind
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            text = _text(message.get("content"))
            for kind, sentence in _BY_PLACE["user"]:
                if sentence in text:
                    return kind
            break
    return None


def self_call(headers, messages: list) -> str | None:
    """The kind of harness self-call this is (rules 1-3 of the module docstring), or None for the harness's own
    turns and for what cannot be told."""
    return from_headers(headers.self_call, headers.codex_turn, headers.subagent) or from_prompt(messages)
