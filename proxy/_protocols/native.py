"""Native mode: Responses / Messages calls passed through to the upstream's own endpoint, recorded all the same.

For hosted teachers (or an engine's native endpoints) the body goes upstream unchanged and the answer comes back
unchanged; the proxy still records the call in the same ``CallRecord``, reading the answer (text, tool calls,
reasoning, usage) out of the protocol's own objects or events. Such calls carry no token ids and are recorded as
not token-exact (invariant 2). A stream's terminal event is held back until the call is journaled (invariant 1).
"""

from __future__ import annotations

import orjson

from .._record import Completion
from .contract import chat_tool_call, sse_data


class PassthroughRelay:
    """Every upstream event goes on unchanged except the terminal one, held back until the call is journaled.

    ``complete(events)`` builds the record's answer from the parsed events; ``failure(exc)`` renders a proxy-side
    failure (upstream dropped, timed out) as the protocol's error event.
    """

    def __init__(self, *, terminal: tuple[str, ...], failed: tuple[str, ...], complete, failure):
        self.terminal, self.failed, self.complete, self.failure = terminal, failed, complete, failure
        self.done, self.error, self.first_token = False, None, False
        self.events: list[dict] = []
        self._held = b""

    def feed(self, event: bytes) -> bytes:
        data = sse_data(event)
        try:
            obj = orjson.loads(data) if data and data != b"[DONE]" else None
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            return event + b"\n\n"
        self.events.append(obj)
        kind = obj.get("type")
        self.first_token = self.first_token or kind in ("response.output_text.delta", "content_block_delta")
        if kind in self.failed:
            self.error = ("upstream_stream_error", data[:2000].decode(errors="replace"))
        if kind in self.terminal:
            self.done, self._held = True, event + b"\n\n"
            return b""
        return event + b"\n\n"

    def result(self) -> Completion:
        return self.complete(self.events)

    def end(self) -> bytes:
        return self._held


def _text(parts) -> str:
    if isinstance(parts, str):
        return parts
    return "".join(p.get("text") or p.get("refusal") or "" for p in parts or [] if isinstance(p, dict))


def completion_from_response(resp: dict) -> Completion:
    """A Responses object as the record's protocol-neutral answer."""
    text, reasoning, calls = [], [], []
    for item in resp.get("output") or []:
        kind = item.get("type")
        if kind == "message":
            text.append(_text(item.get("content")))
        elif kind == "reasoning":
            reasoning.append(_text(item.get("content") or item.get("summary")))
        elif kind == "function_call":
            calls.append(chat_tool_call(item.get("call_id"), item.get("name"), item.get("arguments") or ""))
        elif kind == "custom_tool_call":
            calls.append(chat_tool_call(item.get("call_id"), item.get("name"),
                                        orjson.dumps({"input": item.get("input", "")}).decode()))
    reason = (resp.get("incomplete_details") or {}).get("reason")
    finish = {"completed": "tool_calls" if calls else "stop",
              "incomplete": "length" if reason == "max_output_tokens" else reason}.get(resp.get("status"))
    u = resp.get("usage") or {}
    return Completion(text="".join(text) or None, tool_calls=calls, reasoning="".join(reasoning) or None,
                      finish_reason=finish or resp.get("status"),
                      usage={"prompt_tokens": u.get("input_tokens"), "completion_tokens": u.get("output_tokens"),
                             "total_tokens": u.get("total_tokens")} if u else None)


def completion_from_response_events(events: list[dict]) -> Completion:
    for ev in reversed(events):
        if isinstance(ev.get("response"), dict):
            return completion_from_response(ev["response"])
    return Completion()


def completion_from_message_events(events: list[dict]) -> Completion:
    """Messages stream events (or one whole message as a single event) as the record's answer."""
    blocks: dict[int, dict] = {}
    comp, usage = Completion(), {}
    for ev in events:
        kind = ev.get("type")
        if kind in ("message_start", "message"):
            msg = ev.get("message", ev)
            usage.update(msg.get("usage") or {})
            blocks.update({i: dict(b) for i, b in enumerate(msg.get("content") or [])})
            comp.finish_reason = msg.get("stop_reason") or comp.finish_reason
        elif kind == "content_block_start":
            blocks[ev.get("index", len(blocks))] = {**(ev.get("content_block") or {}), "_json": ""}
        elif kind == "content_block_delta":
            b, d = blocks.setdefault(ev.get("index", 0), {"_json": ""}), ev.get("delta") or {}
            for key, name in (("text", "text"), ("thinking", "thinking"), ("partial_json", "_json")):
                if key in d:
                    b[name] = b.get(name, "") + d[key]
        elif kind == "message_delta":
            comp.finish_reason = (ev.get("delta") or {}).get("stop_reason") or comp.finish_reason
            usage.update({k: v for k, v in (ev.get("usage") or {}).items() if v is not None})
    text, thinking = [], []
    for _, b in sorted(blocks.items()):
        if b.get("type") == "text":
            text.append(b.get("text", ""))
        elif b.get("type") == "thinking":
            thinking.append(b.get("thinking", ""))
        elif b.get("type") == "tool_use":
            args = b.get("_json") or orjson.dumps(b.get("input") or {}).decode()
            comp.tool_calls.append(chat_tool_call(b.get("id"), b.get("name"), args))
    comp.text, comp.reasoning = "".join(text) or None, "".join(thinking) or None
    if usage:
        comp.usage = {"prompt_tokens": usage.get("input_tokens"), "completion_tokens": usage.get("output_tokens")}
    return comp
