"""What a Gemini API client gets back from a chat-completions upstream: a ``GenerateContentResponse``, its stream, and
errors, in the shapes the official SDKs (google-genai, and so Gemini CLI) read.

A response is one candidate whose content (role ``model``) holds, in order: the reasoning as a ``thought`` text part
(only when the request's ``thinkingConfig.includeThoughts`` asked for thoughts, as Google does; the record keeps it
either way), the text, one ``functionCall`` part per tool call (``args`` the arguments' JSON object, ``id`` the
upstream's call id, which a client may send back on its ``functionResponse``). Finish reasons: stop and tool calls ->
STOP, length -> MAX_TOKENS, content_filter -> SAFETY. ``usageMetadata`` counts the prompt and candidate tokens.

A stream (``streamGenerateContent?alt=sse``) is ``data:`` events without event names and without a closing
``[DONE]``: one response object per upstream text or thought delta, and a last one (held until the call is
journaled) with the function calls, the finish reason and the usage. Without ``alt=sse`` the same objects go as one
JSON array, written as they come (``[``, ``,``-separated, ``]``), as Google streams it. Errors are
``{"error": {"code", "message", "status", "details"}}``, as the body of an HTTP error or, mid-stream, as one event.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from ..._errors import ProxyError, UpstreamFailure
from .. import openai_chat
from ..completion import Completion
from ..errors import upstream_message
from ..translating_relay import TranslatingRelay

_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           405: "UNIMPLEMENTED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
           500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


@dataclass(frozen=True)
class Turn:
    """One Gemini call's context: the model it named (echoed as ``modelVersion``), its response id, whether the
    client asked for thoughts, and the stream's framing (``sse`` or a JSON array)."""

    model: str
    id: str
    thoughts: bool
    sse: bool = True


def error_json(status: int, message: str, reason: str | None = None) -> dict:
    err = {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN")}
    if reason:
        err["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                           "domain": "openforge"}]
    return {"error": err}


def error_body(exc: ProxyError) -> dict:
    """A ProxyError in Google's error shape (``code`` the HTTP status, ``status`` its canonical name, the proxy's
    own code as the ``ErrorInfo`` reason)."""
    return error_json(exc.status, exc.message, exc.code)


def upstream_error(status: int, body: bytes, content_type: str | None) -> tuple[bytes, str | None]:
    """An upstream's (OpenAI-shaped) HTTP error re-shaped for a Gemini client, its message kept."""
    return orjson.dumps(error_json(status, upstream_message(body), "upstream_error")), None


def usage(chat_usage: dict | None, prompt_len: int = 0) -> dict:
    u = chat_usage if isinstance(chat_usage, dict) else {}
    prompt, out = u.get("prompt_tokens", prompt_len) or 0, u.get("completion_tokens") or 0
    meta = {"promptTokenCount": prompt, "candidatesTokenCount": out, "totalTokenCount": prompt + out}
    details = u.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens"):
        meta["cachedContentTokenCount"] = details["cached_tokens"]
    return meta


def function_call(tc: dict) -> dict:
    fn = tc.get("function") or {}
    arguments = fn.get("arguments") or ""
    try:
        args = orjson.loads(arguments) if arguments.strip() else {}
    except orjson.JSONDecodeError:
        args = None
    call = {"name": fn.get("name") or "", "args": args if isinstance(args, dict) else {"_raw_arguments": arguments}}
    if tc.get("id"):
        call["id"] = tc["id"]
    return {"functionCall": call}


def _response(turn: Turn, parts: list[dict], finish: str | None = None, meta: dict | None = None) -> dict:
    candidate: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    out: dict = {"candidates": [candidate]}
    if meta is not None:
        out["usageMetadata"] = meta
    out["modelVersion"], out["responseId"] = turn.model, turn.id
    return out


def finish_reason(comp: Completion) -> str:
    return _FINISH.get(comp.finish_reason or "stop", "OTHER")


def answer(data: dict, turn: Turn) -> dict:
    """A one-piece upstream chat answer as a Gemini ``GenerateContentResponse``."""
    comp = openai_chat.parse(data)
    parts = []
    if comp.reasoning and turn.thoughts:
        parts.append({"text": comp.reasoning, "thought": True})
    if comp.text:
        parts.append({"text": comp.text})
    parts += [function_call(tc) for tc in comp.tool_calls]
    return _response(turn, parts, finish_reason(comp), usage(comp.usage))


class GeminiRelay(TranslatingRelay):
    """Upstream chat chunks in, Gemini stream events out (see the module docstring)."""

    def __init__(self, turn: Turn):
        self.turn, self.chat = turn, openai_chat.StreamState(openai_chat.Wants(False, False, False))
        self.sent = False

    def _event(self, obj: dict) -> bytes:
        data = orjson.dumps(obj)
        if self.turn.sse:
            return b"data: " + data + b"\r\n\r\n"
        head, self.sent = (b"," if self.sent else b"["), True
        return head + data + b"\n"

    def _on_chunk(self, chunk: dict) -> bytes:
        self.chat.feed(chunk)
        parts = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if (reasoning := delta.get("reasoning_content") or delta.get("reasoning")) and self.turn.thoughts:
                parts.append({"text": reasoning, "thought": True})
            if delta.get("content"):
                parts.append({"text": delta["content"]})
        return self._event(_response(self.turn, parts)) if parts else b""

    def _fail(self, kind: str, message: str, status: int = 500) -> bytes:
        self.failed = True
        out = self._event(error_json(status, message, kind))
        return out if self.turn.sse else out + b"]"

    def failure(self, exc: UpstreamFailure) -> bytes:
        return self._fail(exc.error_class, exc.message, exc.status)

    def _finish(self, comp: Completion) -> bytes:
        last = _response(self.turn, [function_call(tc) for tc in comp.tool_calls], finish_reason(comp),
                         usage(comp.usage, len(comp.prompt_token_ids or [])))
        return self._event(last) + (b"" if self.turn.sse else b"]")
