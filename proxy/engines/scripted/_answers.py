"""Turn a script step into token ids, text and vLLM-shaped response bodies / stream chunks.

Field placement follows vLLM's OpenAI server (vllm/entrypoints/openai/chat_completion/protocol.py,
.../chat_completion/serving.py, .../completion/protocol.py, .../completion/serving.py):

- chat, non-streaming: top-level `prompt_token_ids`, per-choice `token_ids`;
- chat, streaming: `prompt_token_ids` at the top level of the first chunk (the role chunk, which
  carries no tokens), `token_ids` on each choice of every later chunk;
- completions: `prompt_token_ids` and `token_ids` both per choice; in streams `prompt_token_ids`
  only on each choice's first chunk;
- the usage chunk has `choices: []`; every stream ends with `data: [DONE]`.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .script import Text, ToolCalls
from .tokenizer import ChatTokenizer, render_tool_calls

_tool_ids = itertools.count(1)


@dataclass
class Answer:
    """One generated completion: ids, per-token text deltas, and what the message says."""

    token_ids: list[int]
    deltas: list[str]  # per token; "" for tokens inside a tool call or special tokens
    finish_reason: str
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None


def as_text(step: Text | ToolCalls) -> Text:
    """A tool-call step as the plain text it is tokenized as (for /v1/completions)."""
    if isinstance(step, Text):
        return step
    rendered = render_tool_calls([{"name": c.name, "arguments": c.arguments} for c in step.calls])
    return Text(f"{step.content}\n{rendered}" if step.content else rendered)


def plan_answer(tok: ChatTokenizer, step: Text | ToolCalls, max_tokens: int) -> Answer:
    """Token ids are encode(text) + eos; past `max_tokens` they are cut and finish_reason is "length".

    Tool calls are tokenized as the text the chat template writes for them (`ChatTokenizer.assistant_text`):
    what a model trained on that template samples, and vLLM's tool parser reads back.
    """
    if isinstance(step, Text):
        full = step.text
    else:
        full = tok.assistant_text(step.content, [{"name": c.name, "arguments": c.arguments} for c in step.calls])
    content_len = len(step.text) if isinstance(step, Text) else len(step.content or "")
    ids = tok.encode(full) + [tok.eos_token_id]
    truncated = len(ids) > max_tokens
    if truncated:
        ids = ids[:max_tokens]
    deltas = tok.incremental_texts(ids)
    if truncated or isinstance(step, Text):
        # a cut tool call cannot be parsed back: vLLM returns its text as content
        return Answer(ids, deltas, "length" if truncated else "stop", "".join(deltas))
    content_deltas, seen = [], 0
    for d in deltas:  # keep the part of each delta that lies inside the content prefix
        content_deltas.append(d[: max(0, content_len - seen)])
        seen += len(d)
    calls = [
        {
            "id": c.id or f"chatcmpl-tool-{next(_tool_ids):016x}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments_json()},
        }
        for c in step.calls
    ]
    return Answer(ids, content_deltas, "tool_calls", step.content, calls)


# -- logprobs --------------------------------------------------------------------------------------


def pseudo_logprob(position: int, token_id: int) -> float:
    """Deterministic stand-in for a sampled token's logprob, in (-2.5, 0]."""
    return -(zlib.crc32(f"{position}:{token_id}".encode()) % 10_000) / 4_000


def _alternatives(tok: ChatTokenizer, position: int, token_id: int, k: int) -> list[tuple[int, float]]:
    """The sampled token first (it is the most likely), then k-1 others with lower logprobs."""
    lp = pseudo_logprob(position, token_id)
    out = [(token_id, lp)]
    step = 7919
    for j in range(1, k):
        alt = (token_id + j * step) % tok.vocab_size
        if alt == token_id:
            alt = (alt + 1) % tok.vocab_size
        out.append((alt, lp - 0.75 * j))
    return out


def _entry(tok: ChatTokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text = tok.token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", errors="replace"))}


def chat_logprobs(tok: ChatTokenizer, ids: Sequence[int], start: int, top: int) -> dict[str, Any]:
    content = []
    for i, tid in enumerate(ids, start):
        alts = _alternatives(tok, i, tid, max(top, 1))
        entry = _entry(tok, tid, alts[0][1])
        entry["top_logprobs"] = [_entry(tok, a, lp) for a, lp in alts[:top]]
        content.append(entry)
    return {"content": content}


def completion_logprobs(
    tok: ChatTokenizer, ids: Sequence[int], deltas: Sequence[str], start: int, top: int, offset: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for i, (tid, d) in enumerate(zip(ids, deltas, strict=True), start):
        alts = _alternatives(tok, i, tid, max(top, 1))
        out["tokens"].append(tok.token_text(tid))
        out["token_logprobs"].append(alts[0][1])
        out["top_logprobs"].append({tok.token_text(a): lp for a, lp in alts[: max(top, 1)]})
        out["text_offset"].append(offset)
        offset += len(d)
    return out


# -- bodies ----------------------------------------------------------------------------------------


def usage(prompt_len: int, completion_len: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_len,
        "total_tokens": prompt_len + completion_len,
        "completion_tokens": completion_len,
        "prompt_tokens_details": None,
    }


@dataclass
class Call:
    """What one request asked for, as far as the response shape is concerned."""

    rid: str
    created: int
    model: str
    prompt_ids: list[int]
    return_token_ids: bool
    logprobs: bool
    top_logprobs: int
    include_usage: bool
    chunk_tokens: int


def chat_body(call: Call, tok: ChatTokenizer, a: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": a.content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    if a.tool_calls:
        message["tool_calls"] = a.tool_calls
    choice = {
        "index": 0,
        "message": message,
        "logprobs": chat_logprobs(tok, a.token_ids, 0, call.top_logprobs) if call.logprobs else None,
        "finish_reason": a.finish_reason,
        "stop_reason": None,
        "token_ids": a.token_ids if call.return_token_ids else None,
    }
    return {
        "id": call.rid,
        "object": "chat.completion",
        "created": call.created,
        "model": call.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(len(call.prompt_ids), len(a.token_ids)),
        "prompt_logprobs": None,
        "prompt_token_ids": call.prompt_ids if call.return_token_ids else None,
        "kv_transfer_params": None,
    }


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def _chunk_spans(n: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(i + size, n)) for i in range(0, n, size)]


def chat_chunks(call: Call, tok: ChatTokenizer, a: Answer) -> list[dict[str, Any]]:
    """The chunks of a chat stream (without [DONE]); the role chunk first, the usage chunk last."""
    head = {"id": call.rid, "object": "chat.completion.chunk", "created": call.created, "model": call.model}
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    chunks = [{**head, "choices": [role], "prompt_token_ids": call.prompt_ids if call.return_token_ids else None}]
    spans = _chunk_spans(len(a.token_ids), call.chunk_tokens)
    for n, (lo, hi) in enumerate(spans):
        last = n == len(spans) - 1
        text = "".join(a.deltas[lo:hi])
        delta: dict[str, Any] = {}
        if text or a.tool_calls is None:
            delta["content"] = text
        if last and a.tool_calls:
            delta["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(a.tool_calls)]
        if not delta and not last and not call.return_token_ids and not call.logprobs:
            continue  # vLLM sends nothing while its tool parser holds tokens back
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": chat_logprobs(tok, a.token_ids[lo:hi], lo, call.top_logprobs) if call.logprobs else None,
            "finish_reason": a.finish_reason if last else None,
            "token_ids": a.token_ids[lo:hi] if call.return_token_ids else None,
        }
        if last:
            choice["stop_reason"] = None
        chunks.append({**head, "choices": [choice]})
    if call.include_usage:
        chunks.append({**head, "choices": [], "usage": usage(len(call.prompt_ids), len(a.token_ids))})
    return chunks


def completion_body(call: Call, tok: ChatTokenizer, a: Answer) -> dict[str, Any]:
    text = "".join(a.deltas)
    choice = {
        "index": 0,
        "text": text,
        "logprobs": completion_logprobs(tok, a.token_ids, a.deltas, 0, call.top_logprobs, 0) if call.logprobs else None,
        "finish_reason": a.finish_reason,
        "stop_reason": None,
        "token_ids": a.token_ids if call.return_token_ids else None,
        "prompt_logprobs": None,
        "prompt_token_ids": call.prompt_ids if call.return_token_ids else None,
    }
    return {
        "id": call.rid,
        "object": "text_completion",
        "created": call.created,
        "model": call.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(len(call.prompt_ids), len(a.token_ids)),
        "kv_transfer_params": None,
    }


def completion_chunks(call: Call, tok: ChatTokenizer, a: Answer) -> list[dict[str, Any]]:
    head = {"id": call.rid, "object": "text_completion", "created": call.created, "model": call.model}
    chunks, offset = [], 0
    spans = _chunk_spans(len(a.token_ids), call.chunk_tokens)
    for n, (lo, hi) in enumerate(spans):
        text = "".join(a.deltas[lo:hi])
        lp = None
        if call.logprobs:
            lp = completion_logprobs(tok, a.token_ids[lo:hi], a.deltas[lo:hi], lo, call.top_logprobs, offset)
        offset += len(text)
        choice = {
            "index": 0,
            "text": text,
            "logprobs": lp,
            "finish_reason": a.finish_reason if n == len(spans) - 1 else None,
            "stop_reason": None,
            "prompt_token_ids": call.prompt_ids if call.return_token_ids and n == 0 else None,
            "token_ids": a.token_ids[lo:hi] if call.return_token_ids else None,
        }
        chunks.append({**head, "choices": [choice]})
    if call.include_usage:
        chunks.append({**head, "choices": [], "usage": usage(len(call.prompt_ids), len(a.token_ids))})
    return chunks
