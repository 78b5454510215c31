"""``Messages``: Anthropic ``/v1/messages`` translated to upstream chat completions (token-exact), and back; also
``/v1/messages/count_tokens``, through the upstream's ``/tokenize``."""

from __future__ import annotations

import uuid

import orjson

from ..._errors import ProxyError
from .. import openai_chat
from ..completion import Completion
from ..contract import SidePost, SideRoute, Translation, WireProtocol
from ..errors import answer_guarded, bad_request, guarded, upstream_message
from .answer import MessagesRelay, answer, error_body, upstream_error
from .request import PROMPT_FIELDS, chat_messages, chat_request, chat_tools, tokenize_request, validate

COUNT_TOKENS_PATH = "/v1/messages/count_tokens"


class Messages(WireProtocol):
    """Translate Anthropic Messages to upstream chat completions (token-exact) and the answers back; errors in
    Anthropic's shape."""

    PATHS = ("/v1/messages",)
    SURFACE = "messages"
    UPSTREAM_PATH = openai_chat.ChatCompletions.UPSTREAM_PATH

    def validate(self, body: dict) -> None:
        validate(body)

    @guarded
    def translate(self, body: dict, dialect: str, rollout_id: str | None) -> Translation:
        notes: dict = {}
        messages = chat_messages(body, notes)
        if not messages:
            raise bad_request("messages: at least one message is required", "messages")
        tools = chat_tools(body.get("tools") or [], notes)
        up, _ = openai_chat.prepare(chat_request(body, messages, tools, notes), dialect)
        ctx = {"id": f"msg_{uuid.uuid4().hex}", "body": body}
        params = {k: v for k, v in body.items() if k not in PROMPT_FIELDS}
        return Translation(messages, tools or None, up, ctx, params, bool(body.get("stream")), notes)

    @answer_guarded
    def parse(self, data: dict) -> Completion:
        return openai_chat.parse(data)

    @answer_guarded
    def answer(self, data: dict, ctx: dict) -> dict:
        return answer(data, ctx)

    def ids_as_text(self, ctx: dict) -> bool:
        return True  # a Messages answer carries no token ids (only their count, in usage)

    def relay(self, ctx: dict) -> MessagesRelay:
        return MessagesRelay(ctx)

    def upstream_error(self, status: int, body: bytes, content_type: str | None) -> tuple[bytes, str | None]:
        return upstream_error(status, body, content_type)

    def error_body(self, exc: ProxyError) -> dict:
        return error_body(exc)

    def side_routes(self) -> tuple[SideRoute, ...]:
        return (SideRoute(COUNT_TOKENS_PATH, post=self.count_tokens),)

    @guarded
    def _tokenize(self, body: dict) -> dict:
        return tokenize_request(body)

    async def count_tokens(self, send: SidePost, body: dict, params: dict) -> dict:
        """``/v1/messages/count_tokens`` through the upstream's ``/tokenize`` (vLLM's) with the chat template, on a
        replica that serves the body's ``model`` (as a call naming it would be sent: ``SidePost``)."""
        tokenize = self._tokenize(body)  # validated: ``model`` is a string if present
        ans = await send("/tokenize", tokenize, tokenize["model"])
        if ans.status != 200:
            raise ProxyError(ans.status if ans.status < 500 else 502,
                             f"the upstream could not count tokens (/tokenize answered {ans.status}: "
                             f"{upstream_message(ans.body)[:300]}); count_tokens needs a vLLM-style /tokenize, or "
                             "messages mode 'native' for an upstream with its own count_tokens",
                             type="upstream_error", code="count_tokens_failed")
        return {"input_tokens": orjson.loads(ans.body).get("count", 0)}
