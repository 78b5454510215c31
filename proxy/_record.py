"""What an adapter extracts from an upstream answer, and how the stored prompt is prepared.

``Completion`` is the protocol-neutral answer (text, tool calls, reasoning, token ids, logprobs, usage) that every
adapter fills, streaming or not. ``PromptCache`` makes the stored copy of a prompt (images moved to the blob store,
redaction applied) cost O(new messages) per call: an agent resends its whole history every turn, so messages
equal to the previous call's reuse that call's prepared copies.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import orjson

from forge_store._images import extract_images
from forge_store._tokens import IdsText

from ._redaction import Redactor

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


@dataclass
class PreparedPrompt:
    messages: list[dict]
    image_hashes: list[str]
    redactions: set[str]


class PromptCache:
    """Per rollout: the previous call's raw messages and their prepared (stored) copies."""

    def __init__(self):
        self._lock = threading.Lock()  # sub-agents may call concurrently within one rollout
        self.raw: list = []
        self.prepared: list = []
        self.images: list[list[str]] = []
        self.hits: list[set[str]] = []
        self._version = 0  # bumped by every prepare, so a ``known`` prefix can be checked for staleness

    def unchanged(self, messages: list) -> tuple[int, int]:
        """How many leading ``messages`` equal the previous call's (only the rest is prepared), with the cache's
        version; pass both to ``prepare`` as ``known`` so the comparison is not made twice."""
        with self._lock:
            return self._same(messages), self._version

    def _same(self, messages: list) -> int:
        same = 0
        for old, new in zip(self.raw, messages):
            if old != new:
                break
            same += 1
        return same

    def prepare(self, messages: list, put_blob, redactor: Redactor,
                known: tuple[int, int] | None = None) -> PreparedPrompt:
        with self._lock:
            same = known[0] if known is not None and known[1] == self._version else self._same(messages)
            prepared, images, hits = self.prepared[:same], self.images[:same], self.hits[:same]
            for m in messages[same:]:
                (stored,), found = extract_images([m], put_blob)
                h: set[str] = set()
                prepared.append(redactor.apply(stored, h))
                images.append(found)
                hits.append(h)
            self.raw, self.prepared, self.images, self.hits = list(messages), prepared, images, hits
            self._version += 1
            return PreparedPrompt(prepared, [x for per in images for x in per], set().union(*hits) if hits else set())


_IMAGE_PARTS = frozenset(("image_url", "input_image", "image"))


def _has_image_part(parts) -> bool:
    for part in parts if isinstance(parts, list) else ():
        if isinstance(part, dict) and (part.get("type") in _IMAGE_PARTS or _has_image_part(part.get("content"))):
            return True
    return False


def has_inline_data(messages: list, start: int = 0) -> bool:
    """Whether messages past ``start`` carry image parts (whose blob writes should not block the event loop).

    Text-only content lists (Claude Code sends every message as a list of blocks) stay on the loop: a thread hop
    per call would cost more than the preparation itself. Tool results nest their content one level down."""
    return any(_has_image_part(m.get("content")) for m in messages[start:] if isinstance(m, dict))
