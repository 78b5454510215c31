"""OpenAI ``/v1/completions`` (text or token-id prompts), with the same token-id capture as chat.

vLLM puts ``prompt_token_ids`` and ``token_ids`` on each choice here (not top-level as in chat); logprobs are the
legacy ``{tokens, token_logprobs, ...}`` shape, asked for with ``logprobs: 0`` (the sampled token only) when the
client did not ask.
"""

from __future__ import annotations

from .._errors import ProxyError
from .body import check_body
from .completion import Completion
from .contract import Translation
from .openai_chat import PROMPT_KEYS, ChatCompletions, ChatRelay, Wants
from .openai_chat import StreamState as ChatStreamState


def validate(body: dict) -> None:
    check_body(body)
    if "prompt" not in body:
        raise ProxyError(400, "'prompt' is required: a string, a list of strings or a list of token ids",
                         param="prompt", code="missing_prompt")


def prepare(body: dict, dialect: str) -> tuple[dict, Wants]:
    stream_opts = body.get("stream_options") or {}
    wants = Wants(token_ids=bool(body.get("return_token_ids")), logprobs=body.get("logprobs") is not None,
                  usage_chunk=bool(stream_opts.get("include_usage")))
    up = dict(body)
    if dialect in ("vllm", "sglang"):
        up["return_token_ids"] = True
        if body.get("logprobs") is None:
            up["logprobs"] = 0
    if body.get("stream"):
        up["stream_options"] = {**stream_opts, "include_usage": True}
    return up, wants


def _values(logprobs) -> list[float] | None:
    if isinstance(logprobs, dict) and logprobs.get("token_logprobs") is not None:
        return list(logprobs["token_logprobs"])
    return None


def parse(data: dict) -> Completion:
    choices = data.get("choices") or []
    first = choices[0] if choices else {}
    comp = Completion(
        text=first.get("text"), finish_reason=first.get("finish_reason"),
        prompt_token_ids=first.get("prompt_token_ids") or data.get("prompt_token_ids"),
        completion_token_ids=first.get("token_ids"), logprobs=_values(first.get("logprobs")), usage=data.get("usage"),
    )
    for extra in choices[1:]:
        comp.extra_choices.append({"index": extra.get("index"), "text": extra.get("text"),
                                   "finish_reason": extra.get("finish_reason"), "token_ids": extra.get("token_ids"),
                                   "logprobs": _values(extra.get("logprobs"))})
    return comp


def strip(data: dict, wants: Wants) -> dict:
    if not wants.token_ids:
        data.pop("prompt_token_ids", None)
    for choice in data.get("choices") or []:
        if not wants.token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        if not wants.logprobs:
            choice["logprobs"] = None
    return data


class StreamState(ChatStreamState):
    def _feed_choice(self, choice: dict) -> None:
        c = self.comp
        if choice.get("prompt_token_ids") is not None:
            c.prompt_token_ids = choice["prompt_token_ids"]
        if choice.get("token_ids"):
            self.saw_ids = True
            c.completion_token_ids.extend(choice["token_ids"])
        values = _values(choice.get("logprobs"))
        if values:
            c.logprobs.extend(values)
        if choice.get("text"):
            self._text.append(choice["text"])
            self.first_token = True
        if choice.get("finish_reason"):
            c.finish_reason = choice["finish_reason"]

    def feed(self, chunk: dict) -> dict | None:
        out = super().feed(chunk)
        if out is not None and not self.wants.everything:
            strip(out, self.wants)
        return out


class Completions(ChatCompletions):
    """Like chat completions (the client's API is the upstream's); the prompt is stored as one message with role
    "prompt"."""

    PATHS = ("/v1/completions",)
    SURFACE = "completions"
    UPSTREAM_PATH = "/v1/completions"

    def validate(self, body: dict) -> None:
        validate(body)

    def translate(self, body: dict, dialect: str, rollout_id: str | None) -> Translation:
        up, wants = prepare(body, dialect)
        return Translation([{"role": "prompt", "content": body["prompt"]}], body.get("tools"), up, wants,
                           {k: v for k, v in body.items() if k not in PROMPT_KEYS},
                           bool(body.get("stream")))

    def parse(self, data: dict) -> Completion:
        return parse(data)

    def answer(self, data: dict, wants: Wants) -> dict:
        return strip(data, wants)

    def relay(self, wants: Wants) -> ChatRelay:
        return ChatRelay(StreamState(wants))
