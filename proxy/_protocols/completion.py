"""What a wire protocol extracts from an upstream answer: ``Completion``, the protocol-neutral answer (text, tool
calls, reasoning, token ids, logprobs, usage) that every protocol fills, streaming or not; and ``loads_answer``,
the parse of an upstream's JSON that leaves the prompt's token ids as text."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from forge_store import IdsText

_IDS_KEY = b'"prompt_token_ids":['
_MARK_STR = "\u0000openforge-ids"  # where the cut ids were; no engine sends this string
_MARKED = b'"prompt_token_ids":"\\u0000openforge-ids"'  # the key with the mark for a value, as JSON


def loads_answer(raw: bytes, ids_as_text: bool = False) -> dict:
    """``orjson.loads(raw)``; with ``ids_as_text``, the prompt's token ids (top level in chat answers, the first
    choice in completions) come back as ``IdsText`` cut from the raw JSON instead of parsed into ints: for a
    2,000-id prompt the ints were 90% of the answer's parse, and their packing to uint32 came on top (the store's
    writer packs the text instead, off the proxy's loop). Anything unexpected takes the plain parse."""
    if ids_as_text and (i := raw.find(_IDS_KEY)) >= 0:
        start = i + len(_IDS_KEY)
        end = raw.find(b"]", start)
        ids = IdsText.parse(raw[start:end]) if end >= 0 else None
        if ids is not None:
            data = orjson.loads(raw[:i] + _MARKED + raw[end + 1:])
            if isinstance(data, dict):
                choices = data.get("choices")
                for holder in (data, choices[0] if isinstance(choices, list) and choices else None):
                    if isinstance(holder, dict) and holder.get("prompt_token_ids") == _MARK_STR:
                        holder["prompt_token_ids"] = ids
                        return data
    return orjson.loads(raw)


def chat_tool_call(call_id: str, name: str, arguments: str) -> dict:
    """One tool call as a chat assistant message carries it."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@dataclass
class Completion:
    text: str | None = None
    tool_calls: list[dict] = field(default_factory=list)
    reasoning: str | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | IdsText | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    usage: dict | None = None
    extra_choices: list[dict] = field(default_factory=list)

    def response(self) -> dict:
        out = {"text": self.text, "tool_calls": self.tool_calls or None, "reasoning": self.reasoning}
        if self.extra_choices:
            out["extra_choices"] = self.extra_choices
        return out

    def message(self) -> dict:
        """The assistant message as an OpenAI chat history would carry it into the next prompt."""
        msg = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg

    @property
    def token_exact(self) -> bool:
        return self.prompt_token_ids is not None and self.completion_token_ids is not None

    def checked_logprobs(self) -> list[float] | None:
        if self.logprobs is None or self.completion_token_ids is None:
            return None
        return self.logprobs if len(self.logprobs) == len(self.completion_token_ids) else None
