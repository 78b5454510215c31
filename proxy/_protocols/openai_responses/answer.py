"""What a Responses client gets back from a chat-completions upstream: the response object, its output items and
the streamed events, in the order and shape the official SDKs (and Codex CLI) expect.

Items: reasoning (``content: [reasoning_text]``, plus ``encrypted_content`` when the client asked for it), then the
assistant message, then one ``function_call`` / ``custom_tool_call`` per tool call. A stream opens with
``response.created`` + ``response.in_progress``, streams reasoning and text deltas as they come, sends tool calls
whole when the upstream finishes (their arguments are only known complete then), and closes with
``response.completed`` (``response.incomplete`` when cut at the token limit) or ``response.failed``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import uuid
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass, field

import orjson

from forge_store import NotFound, Store, StoreUnavailable

from ..._errors import ProxyError
from ..._store_wait import until_found
from .. import openai_chat
from ..completion import Completion, chat_tool_call
from ..sse import sse_event
from ..translating_relay import TranslatingRelay

_SEAL = "ofr1:"
RESPONSE_ID = "response_id"  # the call's metadata key for the Responses id it answered (kept responses only)
INSTRUCTIONS = "instructions_messages"  # how many leading prompt messages were the instructions
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def hex_id() -> str:
    return uuid.uuid4().hex


def seal(reasoning: str) -> str:
    """The ``encrypted_content`` the proxy hands out: the reasoning text as an opaque token the client sends back."""
    return _SEAL + base64.urlsafe_b64encode(reasoning.encode()).decode()


def unseal(token) -> str | None:
    """The reasoning text inside a token made by ``seal``; None for anyone else's (e.g. OpenAI's) token."""
    if not isinstance(token, str) or not token.startswith(_SEAL):
        return None
    try:
        return base64.urlsafe_b64decode(token[len(_SEAL):]).decode()
    except (binascii.Error, ValueError):
        return None


@dataclass
class ToolMap:
    """Chat tool names <-> Responses tools: (kind, namespace, name) by the name the model sees."""

    by_chat: dict[str, tuple[str, str | None, str]] = field(default_factory=dict)

    @staticmethod
    def chat_name(name: str, namespace: str | None = None) -> str:
        return f"{namespace}.{name}" if namespace else name

    def lookup(self, chat_name: str) -> tuple[str, str | None, str]:
        return self.by_chat.get(chat_name, ("function", None, chat_name))


class ResponseMemory:
    """Recent conversations by (rollout, response id), for ``previous_response_id``; least recently used go first.

    With ``store`` (proxy replicas: ``proxy._build``), a response another replica answered is read back from the
    store (``recall``): its call carries the response id in its metadata (``RESPONSE_ID``), its prompt is the
    conversation (less the instructions' ``INSTRUCTIONS`` leading messages), its answer the last assistant message.
    The call is journaled by that replica before the client got the answer, but reaches the database a moment
    later (a batch; a killed replica's journal only when its successor drains it): ``wait_s`` bounds how long the
    store is asked again."""

    def __init__(self, capacity: int = 4096, *, store: Store | None = None, wait_s: float = 5.0):
        self.capacity, self._items = capacity, OrderedDict()
        self.store, self.wait_s = store, wait_s

    def get(self, rollout_id: str | None, response_id: str) -> list[dict] | None:
        key = (rollout_id, response_id)
        if key in self._items:
            self._items.move_to_end(key)
        return self._items.get(key)

    def put(self, rollout_id: str | None, response_id: str, history: list[dict]) -> None:
        self._items[(rollout_id, response_id)] = history
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def recall(self, rollout_id: str | None, response_id: str) -> Awaitable[None] | None:
        """What to await before ``get`` can answer for a response this process does not hold, if the store may have
        it (None: nothing to fetch; ``get`` answers as it can)."""
        if self.store is None or rollout_id is None or (rollout_id, response_id) in self._items:
            return None
        return self._fetch(rollout_id, response_id)

    async def _fetch(self, rollout_id: str, response_id: str) -> None:
        try:
            call = await until_found(self.store.find_call, rollout_id, RESPONSE_ID, response_id, wait_s=self.wait_s)
        except NotFound:
            return  # unknown: ``get`` says so
        except StoreUnavailable:  # refused or broken: the store cannot say now
            raise ProxyError(503, f"previous response {response_id!r} was answered by another proxy replica and "
                                  "the store, which holds it, cannot be read now; retry later",
                             type="server_error", code="store_unavailable") from None
        if call.error_class is not None:
            return  # a failed answer is not remembered (no replica keeps it)
        if (call.metadata or {}).get("redacted"):
            raise ProxyError(400, f"previous response {response_id!r} was answered by another proxy replica, whose "
                                  "stored copy is redacted (rules " + ", ".join(call.metadata["redacted"]) + "): the "
                                  "conversation cannot be continued from it as it was; send the full conversation as "
                                  "input, or route the rollout to one replica", param="previous_response_id",
                             code="previous_response_redacted")
        head = int((call.metadata or {}).get(INSTRUCTIONS) or 0)
        history = await asyncio.to_thread(self.store.restore_images, call.messages[head:])
        resp = call.response or {}
        comp = Completion(text=resp.get("text"), tool_calls=resp.get("tool_calls") or [],
                          reasoning=resp.get("reasoning"))
        self.put(rollout_id, response_id, history + [assistant_message(comp)])


@dataclass
class Turn:
    """One Responses call's context: ids, the request (echoed in the response), the tool map, what to remember."""

    id: str
    created: int
    body: dict
    tools: ToolMap
    sealed: bool  # the client asked for reasoning.encrypted_content
    history: list[dict]  # the conversation so far without instructions, kept for previous_response_id
    memory: ResponseMemory | None  # None when the response is not kept (store: false)
    rollout_id: str | None


def assistant_message(comp: Completion) -> dict:
    """The answer as the next turn's history holds it (what the client would resend)."""
    msg: dict = {"role": "assistant", "content": comp.text}
    if comp.tool_calls:
        msg["tool_calls"] = [chat_tool_call(tc.get("id") or "", (tc.get("function") or {}).get("name") or "",
                                            (tc.get("function") or {}).get("arguments") or "")
                             for tc in comp.tool_calls]
    if comp.reasoning:
        msg["reasoning_content"] = comp.reasoning
    return msg


def remember(turn: Turn, comp: Completion) -> None:
    """Keep the conversation including this answer, as the client would resend it, for ``previous_response_id``."""
    if turn.memory is not None:
        turn.memory.put(turn.rollout_id, turn.id, turn.history + [assistant_message(comp)])


def usage(chat_usage: dict | None) -> dict | None:
    if not chat_usage or not isinstance(chat_usage, dict):  # also an upstream's junk: the failure event must render
        return None
    details = chat_usage.get("prompt_tokens_details")
    cached = (details.get("cached_tokens") if isinstance(details, dict) else 0) or 0
    return {"input_tokens": chat_usage.get("prompt_tokens") or 0, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": chat_usage.get("completion_tokens") or 0,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": chat_usage.get("total_tokens") or 0}


def response_object(turn: Turn, finish_reason: str | None, output: list, chat_usage: dict | None,
                    status: str | None = None, error: dict | None = None) -> dict:
    b = turn.body
    incomplete = _INCOMPLETE.get(finish_reason)
    status = status or ("incomplete" if incomplete else "completed")
    return {
        "id": turn.id, "object": "response", "created_at": turn.created, "status": status, "background": False,
        "error": error, "incomplete_details": {"reason": incomplete} if status == "incomplete" else None,
        "instructions": b.get("instructions"), "max_output_tokens": b.get("max_output_tokens"),
        "max_tool_calls": b.get("max_tool_calls"), "model": b.get("model"), "output": output,
        "parallel_tool_calls": b.get("parallel_tool_calls", True),
        "previous_response_id": b.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None, **(b.get("reasoning") or {})},
        "service_tier": "default", "store": b.get("store", True), "temperature": b.get("temperature", 1.0),
        "text": b.get("text") or {"format": {"type": "text"}}, "tool_choice": b.get("tool_choice", "auto"),
        "tools": b.get("tools") or [], "top_p": b.get("top_p", 1.0), "truncation": b.get("truncation", "disabled"),
        "usage": usage(chat_usage), "user": b.get("user"), "metadata": b.get("metadata") or {},
    }


def message_item(item_id: str, text: str, done: bool = True) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if done else []
    return {"id": item_id, "type": "message", "status": "completed" if done else "in_progress", "role": "assistant",
            "content": content}


def reasoning_item(turn: Turn, item_id: str, text: str | None) -> dict:
    item = {"id": item_id, "type": "reasoning", "summary": []}
    if text is not None:
        item["content"] = [{"type": "reasoning_text", "text": text}]
        if turn.sealed:
            item["encrypted_content"] = seal(text)
    return item


def call_item(turn: Turn, tc: dict, item_id: str | None = None, done: bool = True) -> dict:
    """A chat tool call as a function_call (or custom_tool_call, namespaced as declared) output item."""
    fn = tc.get("function") or {}
    kind, namespace, name = turn.tools.lookup(fn.get("name") or "")
    call_id, args = tc.get("id") or f"call_{hex_id()}", fn.get("arguments") or ""
    status = "completed" if done else "in_progress"
    if kind == "custom":
        try:
            parsed = orjson.loads(args)
        except orjson.JSONDecodeError:
            parsed = None
        text = parsed["input"] if isinstance(parsed, dict) and isinstance(parsed.get("input"), str) else args
        item = {"id": item_id or f"ctc_{hex_id()}", "type": "custom_tool_call", "status": status,
                "call_id": call_id, "name": name, "input": text if done else ""}
    else:
        item = {"id": item_id or f"fc_{hex_id()}", "type": "function_call", "status": status, "call_id": call_id,
                "name": name, "arguments": args if done else ""}
    if namespace:
        item["namespace"] = namespace
    return item


def answer(data: dict, turn: Turn) -> dict:
    """A one-piece upstream chat answer as a Responses object."""
    comp = openai_chat.parse(data)
    items = []
    if comp.reasoning:
        items.append(reasoning_item(turn, f"rs_{hex_id()}", comp.reasoning))
    if comp.text:
        items.append(message_item(f"msg_{hex_id()}", comp.text))
    items += [call_item(turn, tc) for tc in comp.tool_calls]
    remember(turn, comp)
    return response_object(turn, comp.finish_reason, items, comp.usage)


class ResponsesRelay(TranslatingRelay):
    """Upstream chat chunks in, Responses events out (see the module docstring for the sequence)."""

    def __init__(self, turn: Turn):
        self.turn, self.chat = turn, openai_chat.StreamState(openai_chat.Wants(False, False, False))
        self.seq, self.items, self.open = 0, [], None  # open: [kind, item id, output index, text so far]

    def _ev(self, kind: str, **fields) -> bytes:
        out = sse_event(kind, {"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1
        return out

    def _head(self) -> bytes:
        if self.seq:
            return b""
        r = response_object(self.turn, None, [], None, status="in_progress")
        return self._ev("response.created", response=r) + self._ev("response.in_progress", response=r)

    ERROR_KIND = "upstream_error"

    def _on_chunk(self, chunk: dict) -> bytes:
        out = self._head()
        self.chat.feed(chunk)
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if reasoning := delta.get("reasoning_content") or delta.get("reasoning"):
                out += self._delta("reasoning", reasoning)
            if delta.get("content"):
                out += self._delta("message", delta["content"])
        return out

    def _delta(self, kind: str, text: str) -> bytes:
        out = b""
        if self.open is None or self.open[0] != kind:
            out += self._close()
            index = len(self.items)
            self.open = [kind, ("rs_" if kind == "reasoning" else "msg_") + hex_id(), index, ""]
            self.items.append(None)
            if kind == "reasoning":
                item, part = reasoning_item(self.turn, self.open[1], None), {"type": "reasoning_text", "text": ""}
            else:
                item = message_item(self.open[1], "", done=False)
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._ev("response.output_item.added", output_index=index, item=item)
            out += self._ev("response.content_part.added", item_id=self.open[1], output_index=index, content_index=0,
                            part=part)
        self.open[3] += text
        if kind == "reasoning":
            return out + self._ev("response.reasoning_text.delta", item_id=self.open[1], output_index=self.open[2],
                                  content_index=0, delta=text)
        return out + self._ev("response.output_text.delta", item_id=self.open[1], output_index=self.open[2],
                              content_index=0, delta=text, logprobs=[])

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        kind, item_id, index, text = self.open
        self.open = None
        if kind == "reasoning":
            item, part = reasoning_item(self.turn, item_id, text), {"type": "reasoning_text", "text": text}
            out = self._ev("response.reasoning_text.done", item_id=item_id, output_index=index, content_index=0,
                           text=text)
        else:
            item = message_item(item_id, text)
            part = item["content"][0]
            out = self._ev("response.output_text.done", item_id=item_id, output_index=index, content_index=0,
                           text=text, logprobs=[])
        self.items[index] = item
        out += self._ev("response.content_part.done", item_id=item_id, output_index=index, content_index=0, part=part)
        return out + self._ev("response.output_item.done", output_index=index, item=item)

    def _tool_call(self, tc: dict) -> bytes:
        index, item = len(self.items), call_item(self.turn, tc)
        self.items.append(item)
        out = self._ev("response.output_item.added", output_index=index,
                       item=call_item(self.turn, tc, item["id"], done=False))
        if item["type"] == "custom_tool_call":
            out += self._ev("response.custom_tool_call_input.delta", item_id=item["id"], output_index=index,
                            delta=item["input"])
            out += self._ev("response.custom_tool_call_input.done", item_id=item["id"], output_index=index,
                            input=item["input"])
        else:
            out += self._ev("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                            delta=item["arguments"])
            out += self._ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            name=item["name"], arguments=item["arguments"])
        return out + self._ev("response.output_item.done", output_index=index, item=item)

    def _fail(self, code: str, message: str) -> bytes:
        self.failed = True
        out = self._head() + self._close()
        r = response_object(self.turn, None, [i for i in self.items if i], self.chat.comp.usage, "failed",
                            {"code": code, "message": message})
        return out + self._ev("response.failed", response=r)

    def _finish(self, comp: Completion) -> bytes:
        out = self._head() + self._close()
        for tc in comp.tool_calls:
            out += self._tool_call(tc)
        remember(self.turn, comp)
        r = response_object(self.turn, comp.finish_reason, self.items, comp.usage)
        return out + self._ev(f"response.{r['status']}", response=r)
