"""OpenAI ``/v1/chat/completions``: ask the engine for token ids, record them, hand back what the client asked for.

Upstream dialects: ``vllm`` (``return_token_ids``: top-level ``prompt_token_ids``, per-choice ``token_ids``; in
streams prompt ids on the first chunk, ids per chunk), ``sglang`` (``return_prompt_token_ids``; completion ids as
``logprobs.content[].token_id``) and ``openai`` (a hosted API: nothing added, calls are not token-exact).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from .._errors import ProxyError, UpstreamFailure
from .body import check_body, check_image_url
from .completion import Completion, loads_answer
from .contract import Translation, WireProtocol
from .errors import answer_guarded
from .sse import sse_data

DIALECTS = ("vllm", "sglang", "openai")
PROMPT_KEYS = ("messages", "tools", "prompt")


@dataclass(frozen=True)
class Wants:
    """What the client itself asked for; everything else the proxy added is stripped from its answer."""

    token_ids: bool
    logprobs: bool
    usage_chunk: bool

    @property
    def everything(self) -> bool:
        return self.token_ids and self.logprobs and self.usage_chunk


def validate(body: dict) -> None:
    check_body(body)
    if not isinstance(body.get("messages"), list) or not all(isinstance(m, dict) for m in body["messages"]):
        raise ProxyError(400, "'messages' must be a list of message objects", param="messages", code="invalid_messages")
    for i, m in enumerate(body["messages"]):
        content = m.get("content")
        if type(content) is list:  # only image parts' data URLs are looked at: the store keeps them as image blobs
            for j, part in enumerate(content):
                if type(part) is dict and part.get("type") == "image_url":
                    url = part.get("image_url")
                    url = url.get("url") if isinstance(url, dict) else None
                    if isinstance(url, str):
                        check_image_url(url, f"messages.{i}.content.{j}", "messages")


def prepare(body: dict, dialect: str) -> tuple[dict, Wants]:
    stream_opts = body.get("stream_options") or {}
    wants = Wants(
        token_ids=bool(body.get("return_token_ids") or body.get("return_prompt_token_ids")),
        logprobs=bool(body.get("logprobs")),
        usage_chunk=bool(stream_opts.get("include_usage")),
    )
    up = dict(body)
    if dialect == "vllm":
        up["return_token_ids"] = True
        up["logprobs"] = True
    elif dialect == "sglang":
        up["return_prompt_token_ids"] = True
        up["logprobs"] = True
    if body.get("stream"):
        up["stream_options"] = {**stream_opts, "include_usage": True}
    return up, wants


def _logprob_values(logprobs) -> tuple[list[float] | None, list[int] | None]:
    content = (logprobs or {}).get("content") if isinstance(logprobs, dict) else None
    if not content:
        return None, None
    values = [c.get("logprob") for c in content]
    ids = [c["token_id"] for c in content if "token_id" in c]
    return values, (ids if len(ids) == len(content) else None)


def parse(data: dict) -> Completion:
    choices = data.get("choices") or []
    first = choices[0] if choices else {}
    msg = first.get("message") or {}
    values, lp_ids = _logprob_values(first.get("logprobs"))
    comp = Completion(
        text=msg.get("content"),
        tool_calls=msg.get("tool_calls") or [],
        reasoning=msg.get("reasoning_content") or msg.get("reasoning"),
        finish_reason=first.get("finish_reason"),
        prompt_token_ids=data.get("prompt_token_ids") or first.get("prompt_token_ids"),
        completion_token_ids=first.get("token_ids") if first.get("token_ids") is not None else lp_ids,
        logprobs=values,
        usage=data.get("usage"),
    )
    for extra in choices[1:]:
        vals, ids = _logprob_values(extra.get("logprobs"))
        comp.extra_choices.append({"index": extra.get("index"), "message": extra.get("message"),
                                   "finish_reason": extra.get("finish_reason"),
                                   "token_ids": extra.get("token_ids", ids), "logprobs": vals})
    return comp


def _strip_choice(choice: dict, wants: Wants) -> None:
    if not wants.token_ids:
        choice.pop("token_ids", None)
        choice.pop("prompt_token_ids", None)
    if not wants.logprobs:
        choice["logprobs"] = None


def strip(data: dict, wants: Wants) -> dict:
    if not wants.token_ids:
        data.pop("prompt_token_ids", None)
    for choice in data.get("choices") or []:
        _strip_choice(choice, wants)
    return data


class StreamState:
    """Assembles a streamed answer chunk by chunk while each chunk goes on to the client at once."""

    def __init__(self, wants: Wants):
        self.wants = wants
        self.comp = Completion(completion_token_ids=[], logprobs=[])
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._tools: dict[int, dict] = {}
        self.saw_ids = False
        self.first_token = False

    def feed(self, chunk: dict) -> dict | None:
        """Record ``chunk``; return what the client should get (None: drop it, it was only for the proxy)."""
        c = self.comp
        if chunk.get("prompt_token_ids") is not None:
            c.prompt_token_ids = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            c.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        for choice in choices:
            if choice.get("index", 0) != 0:
                continue
            self._feed_choice(choice)
        if not choices and chunk.get("usage") and not self.wants.usage_chunk:
            return None
        if self.wants.everything:
            return chunk
        if not self.wants.token_ids:
            chunk.pop("prompt_token_ids", None)
        for choice in choices:
            _strip_choice(choice, self.wants)
        return chunk

    def _feed_choice(self, choice: dict) -> None:
        c = self.comp
        delta = choice.get("delta") or {}
        for where, value in (("delta.content", delta.get("content")), ("delta.reasoning_content",
                             delta.get("reasoning_content")), ("delta.reasoning", delta.get("reasoning")),
                             ("finish_reason", choice.get("finish_reason"))):
            if value is not None and not isinstance(value, str):  # the relay's guard makes it the upstream's 502
                raise ValueError(f"{where} is {type(value).__name__}, not text")
        if choice.get("prompt_token_ids") is not None:
            c.prompt_token_ids = choice["prompt_token_ids"]
        ids = choice.get("token_ids")
        values, lp_ids = _logprob_values(choice.get("logprobs"))
        if ids is None:
            ids = lp_ids
        if ids:
            self.saw_ids = True
            c.completion_token_ids.extend(ids)
            self.first_token = True
        if values:
            c.logprobs.extend(values)
        if delta.get("content"):
            self._text.append(delta["content"])
            self.first_token = True
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            self._reasoning.append(reasoning)
            self.first_token = True
        for tc in delta.get("tool_calls") or []:
            self.first_token = True
            index = tc.get("index", 0)
            if type(index) is not int:  # the slots are sorted by it at the end
                raise ValueError(f"tool call index {index!r} is not an integer")
            slot = self._tools.setdefault(index, {"id": None, "type": "function",
                                                                "function": {"name": "", "arguments": ""}})
            if tc.get("id"):
                slot["id"] = tc["id"]
            fn = tc.get("function") or {}
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""
        if choice.get("finish_reason"):
            c.finish_reason = choice["finish_reason"]

    def result(self) -> Completion:
        c = self.comp
        c.text = "".join(self._text) if self._text else None
        c.reasoning = "".join(self._reasoning) if self._reasoning else None
        c.tool_calls = [self._tools[i] for i in sorted(self._tools)]
        if not self.saw_ids:
            c.completion_token_ids = None
        if not c.logprobs:
            c.logprobs = None
        return c


class ChatRelay:
    """A chat-shaped stream: each upstream chunk goes on as it came (less what the proxy added), ``[DONE]`` last."""

    def __init__(self, state: StreamState):
        self.state, self.done, self.error = state, False, None

    @property
    def first_token(self) -> bool:
        return self.state.first_token

    @answer_guarded
    def feed(self, event: bytes) -> bytes:
        data = sse_data(event)
        if data is None:
            return event + b"\n\n"
        if data == b"[DONE]":
            self.done = True
            return b""
        chunk = loads_answer(data, not self.state.wants.token_ids)
        if "error" in chunk and not chunk.get("choices"):
            self.error = ("upstream_stream_error", data[:2000].decode(errors="replace"))
            return event + b"\n\n"
        out = self.state.feed(chunk)
        if out is None:
            return b""
        return b"data: " + (data if out is chunk and self.state.wants.everything else orjson.dumps(out)) + b"\n\n"

    def failure(self, exc: UpstreamFailure) -> bytes:
        return b"data: " + orjson.dumps(exc.openai_body()) + b"\n\n"

    def result(self) -> Completion:
        return self.state.result()

    def end(self) -> bytes:
        return b"data: [DONE]\n\n" if self.done else b""


class ChatCompletions(WireProtocol):
    """The client's API is the upstream's: the body goes on with the token-id asks added, the answer comes back less
    what the client did not ask for."""

    PATHS = ("/v1/chat/completions",)
    SURFACE = "chat.completions"
    UPSTREAM_PATH = "/v1/chat/completions"

    def validate(self, body: dict) -> None:
        validate(body)

    def translate(self, body: dict, dialect: str, rollout_id: str | None) -> Translation:
        up, wants = prepare(body, dialect)
        return Translation(body["messages"], body.get("tools"), up, wants,
                           {k: v for k, v in body.items() if k not in PROMPT_KEYS}, bool(body.get("stream")))

    @answer_guarded
    def parse(self, data: dict) -> Completion:
        return parse(data)

    @answer_guarded
    def answer(self, data: dict, wants: Wants) -> dict:
        return strip(data, wants)

    def ids_as_text(self, wants: Wants) -> bool:
        return not wants.token_ids  # a client that asked for the ids gets them as the upstream sent them

    def relay(self, wants: Wants) -> ChatRelay:
        return ChatRelay(StreamState(wants))
