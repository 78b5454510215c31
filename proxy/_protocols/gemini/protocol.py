"""``Gemini``: Google's Gemini API (``/v1beta/models/{model}:generateContent``, ``:streamGenerateContent``) translated
to upstream chat completions (token-exact), and back; also ``:countTokens``, through the upstream's ``/tokenize``.

The model is named in the path, not the body, so the registry cannot find these calls by one exact path: the protocol
declares ``MODEL_PATHS`` (the prefixes before ``{model}:{method}``) and ``at`` gives, per call, a ``Gemini`` bound to
the model, the method's streaming and the query's ``alt`` and ``key`` (``proxy._protocols.registry``). The model
goes upstream as the request's ``model`` and through the same pinning as every protocol's (``proxy._models``); the
answer names the model the client asked for (``modelVersion``).
"""

from __future__ import annotations

import urllib.parse
import uuid

import orjson

from ..._errors import ProxyError
from .. import openai_chat
from ..completion import Completion
from ..contract import SidePost, SideRoute, Translation, WireProtocol
from ..errors import answer_guarded, bad_request, guarded, upstream_message
from .answer import GeminiRelay, Turn, answer, error_body, upstream_error
from .params import chat_request, chat_tools
from .request import PROMPT_FIELDS, chat_messages, fields, request

MODEL_PATHS = ("/v1beta/models/", "/v1/models/")
_METHODS = {"generateContent": False, "streamGenerateContent": True}  # method -> streamed


class Gemini(WireProtocol):
    """Translate Gemini API calls to upstream chat completions (token-exact) and the answers back; errors in Google's
    shape. The registry's instance serves no call itself: ``at`` binds one to each call's path."""

    PATHS = ()
    MODEL_PATHS = MODEL_PATHS
    SURFACE = "gemini"
    UPSTREAM_PATH = openai_chat.ChatCompletions.UPSTREAM_PATH

    def __init__(self, model: str = "", stream: bool = False, sse: bool = True):
        self.model, self.stream, self.sse = model, stream, sse

    def at(self, model: str, method: str, query: bytes) -> tuple[WireProtocol, str | None] | None:
        """The protocol for one call to ``{prefix}{model}:{method}?{query}`` and the API key the query carries
        (``?key=``); None for a method that is no model call (``countTokens`` is a side route)."""
        stream = _METHODS.get(method)
        if stream is None or not model:
            return None
        args = urllib.parse.parse_qs(query.decode("latin-1")) if query else {}
        alt = (args.get("alt") or ["json"])[-1]  # a stream without alt=sse is one JSON array, as Google sends it
        return type(self)(model, stream, alt == "sse"), (args.get("key") or [None])[-1]

    @guarded
    def validate(self, body: dict) -> None:
        self._req = request(body)  # this instance serves this one call (``at``): translate reads it

    @guarded
    def translate(self, body: dict, dialect: str, rollout_id: str | None) -> Translation:
        req, notes = getattr(self, "_req", None) or request(body), {}
        messages = chat_messages(req, notes)
        if not messages:  # only signature parts: nothing to prompt with
            raise bad_request("contents: no text, image or function part to send; send at least one", "contents",
                              "missing_contents")
        tools = chat_tools(req.get("tools") or [], notes)
        up, _ = openai_chat.prepare(chat_request(req, self.model, messages, tools, self.stream, notes), dialect)
        thinking = req["generationConfig"].get("thinkingConfig")  # checked by chat_request: an object
        thoughts = bool(thinking and (thinking.get("includeThoughts") or thinking.get("include_thoughts")))
        turn = Turn(self.model, uuid.uuid4().hex[:24], thoughts, self.sse)
        params = {k: v for k, v in req.items() if k not in PROMPT_FIELDS}
        if "model" in params:  # the path names the model, as Google reads it; the body's is kept beside it
            notes["model_in_body"] = params.pop("model")
        params["model"] = self.model
        return Translation(messages, tools or None, up, turn, params, self.stream, notes)

    @answer_guarded
    def parse(self, data: dict) -> Completion:
        return openai_chat.parse(data)

    @answer_guarded
    def answer(self, data: dict, turn: Turn) -> dict:
        return answer(data, turn)

    def ids_as_text(self, turn: Turn) -> bool:
        return True  # a Gemini answer carries no token ids (only their count, in usageMetadata)

    def relay(self, turn: Turn) -> GeminiRelay:
        return GeminiRelay(turn)

    def upstream_error(self, status: int, body: bytes, content_type: str | None) -> tuple[bytes, str | None]:
        return upstream_error(status, body, content_type)

    def error_body(self, exc: ProxyError) -> dict:
        return error_body(exc)

    def side_routes(self) -> tuple[SideRoute, ...]:
        return tuple(SideRoute(prefix + "{model:path}:countTokens", post=self.count_tokens) for prefix in MODEL_PATHS)

    @guarded
    def _tokenize(self, body: dict) -> dict:
        """The vLLM ``/tokenize`` request that counts a ``countTokens`` body's prompt with the chat template (the
        contents themselves, or a whole ``generateContentRequest``)."""
        body = fields(body, ("contents", "generateContentRequest"), "")
        inner = body.get("generateContentRequest")
        if inner is None:
            inner = {"contents": body.get("contents")}
        elif body.get("contents") is not None:
            raise bad_request("countTokens: send contents or generateContentRequest, not both", "contents",
                              "invalid_request")
        req = request(inner)
        tokenize = {"messages": chat_messages(req, {}), "add_generation_prompt": True}
        if tools := chat_tools(req.get("tools") or [], {}):
            tokenize["tools"] = tools
        return tokenize

    async def count_tokens(self, send: SidePost, body: dict, params: dict) -> dict:
        """``:countTokens`` through the upstream's ``/tokenize`` (vLLM's) with the chat template, on a replica that
        serves the path's ``{model}`` (as a call to it would be sent: ``SidePost``)."""
        ans = await send("/tokenize", self._tokenize(body), params["model"])
        if ans.status != 200:
            raise ProxyError(ans.status if ans.status < 500 else 502,
                             f"the upstream could not count tokens (/tokenize answered {ans.status}: "
                             f"{upstream_message(ans.body)[:300]}); countTokens needs a vLLM-style /tokenize",
                             type="upstream_error", code="count_tokens_failed")
        return {"totalTokens": orjson.loads(ans.body).get("count", 0)}
