"""SFT conversations: a rollout's calls -> whole chat conversations in TRL's conversational format.

A row is ``{"messages": [...], "tools": [...]}`` as TRL's ``SFTTrainer`` reads it (its "conversational language
modeling" type with tool calling): each message a struct of ``role``, ``content`` (text; "" for none, as vLLM
renders it), ``tool_calls`` (``id``, ``type``, ``function.name``, ``function.arguments``), ``tool_call_id``, ``name``
and ``reasoning_content``; the arguments and each tool schema are Arrow's JSON type, which Hugging Face ``datasets``
decodes into the dicts a chat template expects (and pyarrow, pandas or DuckDB read as JSON text). Other message keys
are not carried. The tools are the store's copy: canonical JSON, so a schema's keys come back sorted.

Which calls become conversation turns (the plan records an exclusion for every call left out):

* A call that is not training data (``infra_error``; ``truncated`` unless ``keep_truncated``) gives no turn. A call
  that is not token-exact, or whose logprobs do not match its tokens, does (SFT is text; invariant 2).
* A call extends the current conversation when its prompt starts with that conversation (earlier prompt plus
  answer); otherwise it starts a new one (compaction, sub-agents). Messages are compared by what a chat template
  renders (role, text, tool names and arguments, tool_call_id), so a harness that drops a ``content: null`` from
  the answer it sends back still extends.
* SFT trains on every assistant turn of a row, so every assistant turn must be the answer of a call that passed.
  A call whose prompt holds the answer of a call left out (the truncated completion a harness kept in its history)
  is left out with that call's reason; one whose prompt holds an assistant turn no recorded call of the rollout
  answered (history the harness wrote or edited) is left out as ``missing_data``.
* A call whose prompt or answer holds non-text content (images) is ``filtered``: SFT shards hold text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa

from forge_store import StoredCall

from ._reconstruct import CallExclusion, call_problem

_str = pa.string()
TOOL_CALL = pa.struct([("id", _str), ("type", _str),
                       ("function", pa.struct([("name", _str), ("arguments", pa.json_())]))])
MESSAGE = pa.struct([("role", _str), ("content", _str), ("tool_calls", pa.list_(TOOL_CALL)),
                     ("tool_call_id", _str), ("name", _str), ("reasoning_content", _str)])
TEXT_PARTS = ("text", "input_text", "output_text")


class NotText(ValueError):
    """A message content that is not text (an image part): no place in a text conversation."""


@dataclass
class Conversation:
    calls: list[StoredCall]
    messages: list[dict]           # rows of MESSAGE
    keys: list[str] = field(repr=False, default_factory=list)  # what each message renders as, for prefix checks

    @property
    def tools(self) -> list[str] | None:
        """The last call's tool schemas, one JSON text each (Arrow's JSON type)."""
        tools = self.calls[-1].tools
        return [json.dumps(t, ensure_ascii=False) for t in tools] if tools else None


def _text(content) -> str:
    """Message content as text, as vLLM hands it to the template: none as "", text parts joined with newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in TEXT_PARTS:
                texts.append(str(part.get("text") or ""))
            else:
                raise NotText(part.get("type") if isinstance(part, dict) else type(part).__name__)
        return "\n".join(texts)
    raise NotText(type(content).__name__)


def _arguments(raw) -> str:
    """Tool-call arguments as JSON text: the model's own text when it is JSON, else that text as a JSON string."""
    if isinstance(raw, str):
        try:
            json.loads(raw)
            return raw
        except ValueError:
            return json.dumps(raw, ensure_ascii=False)
    return json.dumps({} if raw is None else raw, ensure_ascii=False)


def to_message(msg: dict) -> dict:
    """A stored chat message as a MESSAGE row; raises NotText for image content."""
    calls = [{"id": tc.get("id"), "type": tc.get("type") or "function",
              "function": {"name": (tc.get("function") or {}).get("name"),
                           "arguments": _arguments((tc.get("function") or {}).get("arguments"))}}
             for tc in msg.get("tool_calls") or []]
    return {"role": str(msg.get("role")), "content": _text(msg.get("content")), "tool_calls": calls or None,
            "tool_call_id": msg.get("tool_call_id"), "name": msg.get("name"),
            "reasoning_content": msg.get("reasoning_content") or msg.get("reasoning")}


def render_key(m: dict) -> str:
    """What a template renders of a MESSAGE row: equal keys, equal turns (ids of tool calls and reasoning aside)."""
    calls = [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in m["tool_calls"] or ()]
    return json.dumps([m["role"], m["content"], calls, m["tool_call_id"]], sort_keys=True)


def answer_message(call: StoredCall) -> dict:
    """The call's answer as chat history carries it (the proxy's ``response``: text, tool_calls, reasoning)."""
    resp = call.response or {}
    msg = {"role": "assistant", "content": resp.get("text")}
    if resp.get("tool_calls"):
        msg["tool_calls"] = resp["tool_calls"]
    if resp.get("reasoning"):
        msg["reasoning_content"] = resp["reasoning"]
    return msg


def _convert(messages: list[dict]) -> list[dict] | str:
    try:
        return [to_message(m) for m in messages]
    except NotText as exc:
        return str(exc)


def sft_conversations(calls: list[StoredCall], *, keep_truncated: bool = False
                      ) -> tuple[list[Conversation], list[CallExclusion]]:
    """One rollout's conversations and the calls left out (with reasons), in call order."""
    convs: list[Conversation] = []
    excluded: list[CallExclusion] = []
    answered: dict[str, str] = {}   # render key of an answer that passed -> its call id
    left_out: dict[str, CallExclusion] = {}   # render key of an answer left out -> why
    for call in sorted(calls, key=lambda c: (c.seq, c.id)):
        problem = call_problem(call, keep_truncated=keep_truncated)
        msgs, answer = _convert(call.messages), _convert([answer_message(call)])
        if problem is None or problem.reason in ("not_token_exact", "logprob_mismatch"):  # SFT is text
            problem = _not_text(call, msgs, answer)
        if problem is None:
            keys = [render_key(m) for m in msgs]
            problem = _foreign_turn(msgs, keys, answered, left_out, call.id)
        if problem is not None:
            excluded.append(problem)
            if call.response and not isinstance(answer, str):
                left_out.setdefault(render_key(answer[0]), problem)
            continue
        current = convs[-1] if convs else None
        if current is not None and keys[:len(current.keys)] == current.keys:
            current.calls.append(call)
        else:
            current = Conversation([call], [])
            convs.append(current)
        current.messages = msgs + answer
        current.keys = keys + [render_key(answer[0])]
        answered.setdefault(current.keys[-1], call.id)
    return convs, excluded


def _not_text(call: StoredCall, msgs: list[dict] | str, answer: list[dict] | str) -> CallExclusion | None:
    for what in (msgs, answer):
        if isinstance(what, str):
            return CallExclusion(call.id, "filtered", {
                "content_type": what, "rule": "SFT shards hold text conversations; this call carries non-text "
                                              "content"})
    return None


def _foreign_turn(msgs: list[dict], keys: list[str], answered: dict[str, str], left_out: dict[str, CallExclusion],
                  call_id: str) -> CallExclusion | None:
    """Why ``call_id`` cannot be a turn: an assistant turn of its prompt that no call that passed answered."""
    for i, (m, key) in enumerate(zip(msgs, keys)):
        if m["role"] != "assistant" or key in answered:
            continue
        if key in left_out:
            why = left_out[key]
            return CallExclusion(call_id, why.reason, {
                "message_index": i, "answer_of": why.call_id,
                "rule": f"its prompt holds the answer of call {why.call_id} ({why.reason}) as an assistant turn, "
                        "and SFT trains on every assistant turn"})
        return CallExclusion(call_id, "missing_data", {
            "message_index": i, "rule": "its prompt holds an assistant turn that no recorded call of this rollout "
                                        "answered, and SFT trains on every assistant turn"})
    return None
