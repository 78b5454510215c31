"""What an Anthropic Messages client gets back from a chat-completions upstream: the message, its stream of events,
and errors, in the shapes the official SDKs (and Claude Code) expect.

Content: a ``thinking`` block (with a proxy-made signature), a ``text`` block, one ``tool_use`` block per tool
call. A stream is ``message_start``, ``ping``, per block ``content_block_start`` / ``_delta`` / ``_stop``,
``message_delta`` (stop reason, usage), ``message_stop``; thinking and text stream as they come, tool_use blocks
go whole once the upstream finished (their input must be one JSON object). Errors are
``{"type": "error", "error": {"type", "message"}}``, as JSON or as an ``event: error``.
"""

from __future__ import annotations

import base64
import hashlib
import uuid

import orjson

from ..._errors import ProxyError, UpstreamFailure
from .. import openai_chat
from ..completion import Completion
from ..errors import upstream_message
from ..sse import sse_event
from ..translating_relay import TranslatingRelay

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                529: "overloaded_error"}


def error_body(exc: ProxyError) -> dict:
    """A ProxyError in Anthropic's error shape (the SDKs map the HTTP status; ``type`` names the kind)."""
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(exc.status, "api_error"), "message": exc.message}}


def upstream_error(status: int, body: bytes, content_type: str | None) -> tuple[bytes, str | None]:
    """An upstream's (OpenAI-shaped) HTTP error re-shaped for an Anthropic client, its message kept."""
    kind = _ERROR_TYPES.get(status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": upstream_message(body)}}), None


def error_event(kind: str, message: str) -> bytes:
    return sse_event("error", {"type": "error", "error": {"type": kind, "message": message}})


def signature(thinking: str) -> str:
    """The signature on thinking blocks the proxy makes (clients must send one back; only the text is used)."""
    return "ofr1:" + base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


def usage(chat_usage: dict | None, prompt_len: int = 0) -> dict:
    u = chat_usage if isinstance(chat_usage, dict) else {}
    details = u.get("prompt_tokens_details")
    return {"input_tokens": u.get("prompt_tokens", prompt_len), "output_tokens": u.get("completion_tokens", 0),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": (details.get("cached_tokens") if isinstance(details, dict) else 0) or 0}


def tool_input(arguments: str) -> dict:
    """Tool-call arguments as the JSON object a tool_use block needs; unparseable text is kept, not dropped."""
    if not arguments.strip():
        return {}
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"_raw_arguments": arguments}


def stop_reason(ctx: dict, finish_reason: str | None, matched, has_calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a chat finish reason; ``matched`` is vLLM's ``stop_reason`` (the stop
    string that ended generation, if any)."""
    if has_calls and finish_reason in ("stop", "tool_calls", None):
        return "tool_use", None
    if finish_reason == "stop" and isinstance(matched, str) and matched in (ctx["body"].get("stop_sequences") or []):
        return "stop_sequence", matched
    return _STOP.get(finish_reason, "end_turn"), None


def _tool_use(tc: dict) -> dict:
    fn = tc.get("function") or {}
    return {"type": "tool_use", "id": tc.get("id") or f"toolu_{uuid.uuid4().hex}", "name": fn.get("name") or "",
            "input": tool_input(fn.get("arguments") or "")}


def answer(data: dict, ctx: dict) -> dict:
    """A one-piece upstream chat answer as an Anthropic message."""
    comp = openai_chat.parse(data)
    first = (data.get("choices") or [{}])[0]
    content = []
    if comp.reasoning:
        content.append({"type": "thinking", "thinking": comp.reasoning, "signature": signature(comp.reasoning)})
    if comp.text:
        content.append({"type": "text", "text": comp.text})
    content += [_tool_use(tc) for tc in comp.tool_calls]
    stop, seq = stop_reason(ctx, comp.finish_reason, first.get("stop_reason"), bool(comp.tool_calls))
    return {"id": ctx["id"], "type": "message", "role": "assistant", "model": ctx["body"].get("model"),
            "content": content, "stop_reason": stop, "stop_sequence": seq, "usage": usage(comp.usage)}


class MessagesRelay(TranslatingRelay):
    """Upstream chat chunks in, Messages events out (see the module docstring for the sequence)."""

    def __init__(self, ctx: dict):
        self.ctx, self.chat = ctx, openai_chat.StreamState(openai_chat.Wants(False, False, False))
        self.started = False
        self.blocks, self.open, self.matched, self.thinking = 0, None, None, ""  # open: (kind, index)

    def _head(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        ids = self.chat.comp.prompt_token_ids
        msg = {"id": self.ctx["id"], "type": "message", "role": "assistant", "model": self.ctx["body"].get("model"),
               "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage(None, len(ids or []))}
        return sse_event("message_start", {"type": "message_start", "message": msg}) + sse_event(
            "ping", {"type": "ping"})

    ERROR_KIND = TRUNCATED_KIND = "api_error"

    def _on_chunk(self, chunk: dict) -> bytes:
        self.chat.feed(chunk)
        out = self._head()
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.matched = choice.get("stop_reason")
            delta = choice.get("delta") or {}
            if reasoning := delta.get("reasoning_content") or delta.get("reasoning"):
                self.thinking += reasoning
                out += self._delta("thinking", {"type": "thinking_delta", "thinking": reasoning})
            if delta.get("content"):
                out += self._delta("text", {"type": "text_delta", "text": delta["content"]})
        return out

    def _block(self, index: int, block: dict) -> bytes:
        return sse_event("content_block_start", {"type": "content_block_start", "index": index,
                                                 "content_block": block})

    def _block_delta(self, index: int, delta: dict) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def _delta(self, kind: str, delta: dict) -> bytes:
        out = b""
        if self.open is None or self.open[0] != kind:
            out += self._close()
            self.open, self.blocks = (kind, self.blocks), self.blocks + 1
            out += self._block(self.open[1], {"type": "thinking", "thinking": "", "signature": ""}
                               if kind == "thinking" else {"type": "text", "text": ""})
        return out + self._block_delta(self.open[1], delta)

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        (kind, index), self.open = self.open, None
        out = b""
        if kind == "thinking":
            out += self._block_delta(index, {"type": "signature_delta", "signature": signature(self.thinking)})
        return out + sse_event("content_block_stop", {"type": "content_block_stop", "index": index})

    def _fail(self, kind: str, message: str) -> bytes:
        self.failed = True
        return error_event(kind, message)

    def failure(self, exc: UpstreamFailure) -> bytes:
        return self._fail("overloaded_error" if exc.status == 504 else "api_error", exc.message)

    def _finish(self, comp: Completion) -> bytes:
        out = self._head() + self._close()
        for tc in comp.tool_calls:
            block, index = _tool_use(tc), self.blocks
            self.blocks += 1
            out += self._block(index, {**block, "input": {}})
            out += self._block_delta(index, {"type": "input_json_delta",
                                             "partial_json": orjson.dumps(block["input"]).decode()})
            out += sse_event("content_block_stop", {"type": "content_block_stop", "index": index})
        stop, seq = stop_reason(self.ctx, comp.finish_reason, self.matched, bool(comp.tool_calls))
        out += sse_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop,
                                                                              "stop_sequence": seq},
                                           "usage": usage(comp.usage, len(comp.prompt_token_ids or []))})
        return out + sse_event("message_stop", {"type": "message_stop"})
