"""`ScriptedUpstream`: a stand-in for a vLLM / SGLang OpenAI server, for tests and benchmarks.

A real inference server needs a GPU, which tests (ours and our users') do not have. This double
speaks the same HTTP API as vLLM's OpenAI server, including its token-id protocol
(`return_token_ids`, `logprobs`, `/tokenize`, token-id prompts on `/v1/completions`), tokenizes with
a real tokenizer (SmolLM2-135M-Instruct's, rebuilt offline from a GGUF: see
`proxy.engines.scripted.tokenizer`) and answers from a script (`proxy.engines.scripted.script`) instead of sampling.
Prompt ids are exactly `encode(apply_chat_template(messages, tools))`, as vLLM computes them;
completion ids are `encode(answer) + [eos]`, and tool calls are tokenized as a fixed textual
rendering (a real vLLM would sample whatever the model's template writes and parse it back).

It records every request (body and headers) for assertions and can be made slow or down. Run it
in-process with `run_upstream(...)`, or as `python -m proxy.engines.scripted.upstream --port P --script F`
(then drive it through the `/_scripted/*` admin routes).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from . import _answers as A
from ._admin import add_admin_routes
from .conversations import Conversations, conversations_from_json
from .script import Delay, HTTPError, Script, Step, Text, load_script
from .tokenizer import ChatTokenizer, load_smollm2_tokenizer, message_text

__all__ = ["RecordedRequest", "ScriptedUpstream"]

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
_JSON = "application/json"
_NOT_JSON = object()


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    json: Any
    received_at: float


class _Reject(Exception):
    """Turned into an OpenAI-shaped error response at the route edge."""

    def __init__(self, status: int, message: str, type_: str | None = None) -> None:
        super().__init__(message)
        self.error = HTTPError(status=status, message=message, type=type_)


class ScriptedDisconnect(Exception):
    """Raised inside a stream to drop the connection, as a crashed upstream would."""


def _not_a_scripted_disconnect(record: logging.LogRecord) -> bool:
    """uvicorn logs the exception that drops a connection; a scripted drop is not worth a traceback."""
    return not (record.exc_info and isinstance(record.exc_info[1], ScriptedDisconnect))


def _error_response(err: HTTPError) -> Response:
    return Response(json.dumps(err.body()), status_code=err.status, media_type=_JSON)


def _ok(obj: Any) -> Response:
    # orjson, not json: vLLM serializes in compiled code (pydantic-core), and the stdlib's 150 us for an answer
    # carrying 2,000 prompt ids would be the double's cost, not the engine's, in every measurement through it.
    return Response(orjson.dumps(obj), media_type=_JSON)


class ScriptedUpstream:
    """An OpenAI-compatible server answering from a script. Build once, serve with `run_upstream`."""

    def __init__(
        self,
        script: Iterable[Mapping[str, Any] | Step] | Script = (),
        tokenizer: ChatTokenizer | None = None,
        model: str = DEFAULT_MODEL,
        max_model_len: int | None = None,
        chunk_tokens: int = 1,
        record_limit: int | None = 10_000,
        strict_model: bool = False,
        conversations: Conversations | Mapping[str, Iterable[Mapping[str, Any] | Step]] | None = None,
        owned_by: str = "vllm",
        capacity: int | None = None,
    ) -> None:
        self.script = script if isinstance(script, Script) else Script(script)
        # Chat requests the flat script has no step for: the next step of their conversation (`Conversations`).
        self.conversations = conversations if isinstance(conversations, Conversations) else Conversations(conversations)
        self.tokenizer = tokenizer or load_smollm2_tokenizer()
        self.model = model
        self.max_model_len = max_model_len or self.tokenizer.model_max_length
        self.chunk_tokens = chunk_tokens
        self.strict_model = strict_model
        self.slow = 0.0  # seconds every request waits before it is handled
        self.down: int | None = None  # while set, every API route answers this status
        self.owned_by = owned_by  # the engine /v1/models names: vllm, or e.g. openai to stand in for another kind
        self.set_capacity(capacity)
        self._records: collections.deque[RecordedRequest] = collections.deque(maxlen=record_limit)
        self._app: FastAPI | None = None

    # -- control, from tests ---------------------------------------------------------------------
    @property
    def requests(self) -> list[RecordedRequest]:
        return list(self._records)

    def set_slow(self, seconds: float) -> None:
        self.slow = float(seconds)

    def set_down(self, status: int | None = 503) -> None:
        self.down = status

    def set_capacity(self, slots: int | None) -> None:
        """An engine's batch limit: at most `slots` POSTs are handled at once (each holds its slot for its `slow`
        wait and until its answer, or a stream's first event, is built), the others queue, as past vLLM's
        `max_num_seqs`; with `slow`, at most `slots / slow` calls a second. None: no limit."""
        if slots is not None and slots < 1:
            raise ValueError(f"capacity {slots}: pass 1 or more requests at a time, or None for no limit")
        self.capacity, self._slots = slots, asyncio.Semaphore(slots) if slots else None

    def reset(self) -> None:
        """Forget recorded requests, script and conversations, and be fast and up again."""
        self._records.clear()
        self.script.replace([])
        self.conversations.clear()
        self.slow, self.down = 0.0, None

    # -- the app ---------------------------------------------------------------------------------
    @property
    def app(self) -> FastAPI:
        if self._app is None:
            self._app = self._build_app()
        return self._app

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="OpenForge scripted upstream", docs_url=None, redoc_url=None, openapi_url=None)
        uvicorn_errors = logging.getLogger("uvicorn.error")
        if _not_a_scripted_disconnect not in uvicorn_errors.filters:
            uvicorn_errors.addFilter(_not_a_scripted_disconnect)
        api = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("GET", "/v1/models"): self._models,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._detokenize,
            ("GET", "/health"): self._health,
        }
        for (method, path), handler in api.items():
            app.add_api_route(path, self._gated(handler), methods=[method])
        add_admin_routes(app, self)
        return app

    def _gated(self, handler):
        """Record the request, then apply the slow / down state, then run the handler."""

        async def route(request: Request) -> Response:
            raw = await request.body()
            try:
                body = orjson.loads(raw) if raw else None
            except ValueError:
                body = _NOT_JSON
            headers = dict(request.headers)
            self._records.append(RecordedRequest(request.method, request.url.path, headers, body, time.time()))
            if self._slots is None or request.method != "POST":
                return await self._handle(handler, body)
            async with self._slots:
                return await self._handle(handler, body)

        route.__name__ = handler.__name__
        return route

    async def _handle(self, handler, body) -> Response:
        if self.slow:
            await asyncio.sleep(self.slow)
        if self.down is not None:
            return _error_response(HTTPError(self.down, "the scripted upstream is down."))
        try:
            if body is _NOT_JSON:
                raise _Reject(400, "the request body is not valid JSON.")
            return await handler(body)
        except _Reject as e:
            return _error_response(e.error)

    # -- shared request handling -----------------------------------------------------------------
    def _limit(self, prompt_len: int, max_tokens: Any) -> int:
        """Completion token budget, with vLLM's context-length errors."""
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise _Reject(400, f"max_tokens must be at least 1, got {max_tokens!r}.")
        room = self.max_model_len - prompt_len
        if room <= 0:
            raise _Reject(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, your request "
                f"has {prompt_len} input tokens. Please reduce the length of the input messages.",
            )
        if max_tokens is not None and max_tokens > room:
            raise _Reject(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                f"context length is {self.max_model_len} tokens and your request has {prompt_len} input tokens "
                f"({max_tokens} > {self.max_model_len} - {prompt_len}).",
            )
        return max_tokens or room

    def _call(self, body: Mapping[str, Any], prompt_ids: list[int], prefix: str, logprobs: bool, top: int) -> A.Call:
        if self.strict_model and body.get("model") not in (None, self.model):
            raise _Reject(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        if (body.get("n") or 1) != 1:
            raise _Reject(400, f"n={body.get('n')}: the scripted upstream answers one choice per request.")
        opts = body.get("stream_options") or {}
        return A.Call(
            rid=f"{prefix}-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.model,
            prompt_ids=prompt_ids,
            return_token_ids=bool(body.get("return_token_ids")),
            logprobs=logprobs,
            top_logprobs=top,
            include_usage=bool(opts.get("include_usage")),
            chunk_tokens=max(1, self.chunk_tokens),
        )

    async def _respond(self, body, call: A.Call, request_text: str, limit: int, as_chat: bool) -> Response:
        step = self.script.next_step(request_text)
        delay = chunk_delay = 0.0
        if isinstance(step, Delay):
            delay, chunk_delay, step = step.seconds, step.chunk_delay, step.then
        if step is None and as_chat and len(self.conversations):
            step = self.conversations.step_for(body["messages"])
        if step is None:
            step = Text(request_text)  # default: echo, cut to max_tokens
        stream = bool(body.get("stream"))
        if isinstance(step, HTTPError) and not (stream and step.after_chunks is not None):
            if delay:
                await asyncio.sleep(delay)
            return _error_response(step)
        answer_step = Text(request_text) if isinstance(step, HTTPError) else step
        if not as_chat:  # /v1/completions has no tool calls: their rendering is plain text there
            answer_step = A.as_text(answer_step)
        answer = A.plan_answer(self.tokenizer, answer_step, limit)
        if not stream:
            if delay:
                await asyncio.sleep(delay)
            build = A.chat_body if as_chat else A.completion_body
            return _ok(build(call, self.tokenizer, answer))
        chunks = (A.chat_chunks if as_chat else A.completion_chunks)(call, self.tokenizer, answer)
        lead = 1 if as_chat else 0  # the chat role chunk carries no tokens
        cut = getattr(step, "disconnect_after", None)
        error = step if isinstance(step, HTTPError) else None
        if error is not None:
            cut = error.after_chunks
        return StreamingResponse(
            self._stream(chunks, lead, cut, error, delay, chunk_delay), media_type="text/event-stream"
        )

    @staticmethod
    async def _stream(chunks, lead: int, cut: int | None, error: HTTPError | None, delay: float, chunk_delay: float):
        """Yield SSE events; after `cut` token chunks, drop the connection or send `error`."""
        if delay:
            await asyncio.sleep(delay)
        sent = 0
        for i, chunk in enumerate(chunks):
            carries_tokens = i >= lead and bool(chunk["choices"])
            if carries_tokens and cut is not None and sent >= cut:
                break
            if chunk_delay and i > 0:
                await asyncio.sleep(chunk_delay)
            yield A.sse(chunk)
            sent += carries_tokens
        else:
            if error is None:
                yield A.DONE
                return
        if error is None:
            raise ScriptedDisconnect(f"scripted disconnect after {cut} chunks")
        yield A.sse(error.body())  # vLLM's mid-stream error event, then [DONE]
        yield A.DONE

    # -- routes ----------------------------------------------------------------------------------
    async def _chat(self, body: Any) -> Response:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise _Reject(400, "a chat completion request needs a non-empty `messages` list.")
        try:
            prompt_ids = self.tokenizer.encode_chat(
                body["messages"], body.get("tools"), body.get("add_generation_prompt", True)
            )
        except (ValueError, KeyError, TypeError, jinja2.TemplateError) as e:
            raise _Reject(400, f"cannot apply the chat template to these messages: {e}") from None
        limit = self._limit(len(prompt_ids), body.get("max_completion_tokens") or body.get("max_tokens"))
        top = body.get("top_logprobs") or 0
        call = self._call(body, prompt_ids, "chatcmpl", bool(body.get("logprobs")), top)
        user = [m for m in body["messages"] if m.get("role") == "user"]
        request_text = message_text(user[-1].get("content")) if user else ""
        return await self._respond(body, call, request_text, limit, as_chat=True)

    async def _completions(self, body: Any) -> Response:
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < self.tokenizer.vocab_size]
            if bad:
                raise _Reject(400, f"Token id {bad[0]} is out of vocabulary (size {self.tokenizer.vocab_size}).")
            prompt_ids = list(prompt)
        else:
            raise _Reject(400, "`prompt` must be one non-empty string or one list of token ids.")
        max_tokens = body.get("max_tokens")
        limit = self._limit(len(prompt_ids), 16 if max_tokens is None else max_tokens)  # vLLM's default: 16
        lp = body.get("logprobs")
        call = self._call(body, prompt_ids, "cmpl", lp is not None, int(lp or 0))
        text = prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt_ids, skip_special_tokens=True)
        return await self._respond(body, call, text, limit, as_chat=False)

    async def _models(self, body: Any) -> Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": self.owned_by,
            "root": self.model,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        return _ok({"object": "list", "data": [card]})

    async def _tokenize(self, body: Any) -> Response:
        if not isinstance(body, dict) or not ("messages" in body or "prompt" in body):
            raise _Reject(400, "/tokenize needs `messages` or `prompt`.")
        if "messages" in body:
            text = self.tokenizer.apply_chat_template(
                body["messages"], body.get("tools"), body.get("add_generation_prompt", True)
            )
            ids = self.tokenizer.encode(text, add_special_tokens=body.get("add_special_tokens", False))
        else:
            ids = self.tokenizer.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))
        strs = [self.tokenizer.tokenizer.id_to_token(i) for i in ids] if body.get("return_token_strs") else None
        return _ok({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs})

    async def _detokenize(self, body: Any) -> Response:
        if not isinstance(body, dict) or not isinstance(body.get("tokens"), list):
            raise _Reject(400, "/detokenize needs a `tokens` list.")
        return _ok({"prompt": self.tokenizer.decode(body["tokens"])})

    async def _health(self, body: Any) -> Response:
        return Response(status_code=200)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m proxy.engines.scripted.upstream", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--script", help="JSON (or YAML) file with the steps to answer")
    parser.add_argument("--conversations", help="JSON file {first user message: steps or actions.json list}")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--chunk-tokens", type=int, default=1, help="tokens per stream chunk")
    parser.add_argument("--tokenizer-cache", default=None, help="where the rebuilt tokenizer is cached")
    parser.add_argument("--owned-by", default="vllm", help="the engine /v1/models names (vllm, sglang, openai, ...)")
    parser.add_argument("--slow", type=float, default=0.0, help="seconds every request waits (an engine's latency)")
    parser.add_argument("--capacity", type=int, default=None, help="requests handled at once (an engine's batch)")
    args = parser.parse_args(argv)
    upstream = ScriptedUpstream(
        load_script(args.script) if args.script else (),
        tokenizer=load_smollm2_tokenizer(args.tokenizer_cache),
        model=args.model,
        max_model_len=args.max_model_len,
        chunk_tokens=args.chunk_tokens,
        conversations=conversations_from_json(json.loads(Path(args.conversations).read_text(encoding="utf-8")))
        if args.conversations else None,
        owned_by=args.owned_by,
        capacity=args.capacity,
    )
    upstream.set_slow(args.slow)
    # A real engine's latency has no Python collector in it: keep the double's startup objects (the tokenizer above
    # all) out of full collections, which otherwise stalled every in-flight answer ~70 ms at a time under load.
    gc.collect()
    gc.freeze()
    uvicorn.run(upstream.app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
