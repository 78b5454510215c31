"""``NativeMessages``: Messages calls passed through to the upstream's own ``/v1/messages`` (a hosted teacher, or an
engine's native endpoint), recorded all the same: the answer (text, tool calls, thinking, usage) is read out of the
message or its stream events. Such calls carry no token ids and are recorded as not token-exact (invariant 2).
"""

from __future__ import annotations

import orjson

from ..._errors import ProxyError
from ..body import NOT_AN_IMAGE
from ..completion import Completion, chat_tool_call
from ..contract import SidePost, Translation
from ..errors import upstream_message
from ..passthrough import PassthroughRelay
from .answer import error_event
from .protocol import COUNT_TOKENS_PATH, Messages
from .request import PROMPT_FIELDS, chat_messages


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


class NativeMessages(Messages):
    """Pass Messages calls through to the upstream's own ``/v1/messages``: recorded, not token-exact."""

    UPSTREAM_PATH = "/v1/messages"

    def translate(self, body: dict, dialect: str, rollout_id: str | None) -> Translation:
        try:
            messages = chat_messages(body, {})
        except (ProxyError, TypeError, AttributeError, KeyError, ValueError) as exc:  # the upstream judges: as sent
            if getattr(exc, "code", None) == NOT_AN_IMAGE:  # but a non-image is never kept as an image blob
                raise
            messages = [{"role": "system", "content": body.get("system")}, *body["messages"]]
        params = {k: v for k, v in body.items() if k not in PROMPT_FIELDS}
        return Translation(messages, body.get("tools"), body, None, params, bool(body.get("stream")),
                           {"upstream_api": "messages"})

    def parse(self, data: dict) -> Completion:
        return completion_from_message_events([data])

    def ids_as_text(self, ctx) -> bool:
        return False  # the upstream's own answer goes to the client

    def answer(self, data: dict, ctx) -> dict:
        return data

    def relay(self, ctx) -> PassthroughRelay:
        return PassthroughRelay(terminal=("message_stop",), failed=("error",), complete=completion_from_message_events,
                                failure=lambda exc: error_event("api_error", exc.message))

    def upstream_error(self, status: int, body: bytes, content_type: str | None) -> tuple[bytes, str | None]:
        return body, content_type  # the upstream speaks Messages itself

    async def count_tokens(self, send: SidePost, body: dict, params: dict) -> dict:
        model = body.get("model")  # passed through unchecked: the upstream judges a name that is no string
        ans = await send(COUNT_TOKENS_PATH, body, model if isinstance(model, str) else None)
        if ans.status != 200:
            raise ProxyError(ans.status, upstream_message(ans.body), type="upstream_error", code="count_tokens_failed")
        return orjson.loads(ans.body)
