"""A chat-completions upstream that answers with reasoning, as vLLM returns it when a reasoning parser is on.

``ScriptedUpstream`` speaks vLLM's token-id protocol but has no reasoning parser; this double answers every call
with the same reasoning + text (or tool calls), ``reasoning_content`` in the message / deltas, vLLM's token ids
(prompt ids on the first chunk, ids per chunk) and per-token logprobs, and records each request body.
"""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route


class ReasoningUpstream:
    def __init__(self, reasoning: str = "First, 2 + 2 is 4.", text: str = "The answer is 4.",
                 tool_calls: list[dict] | None = None):
        self.reasoning, self.text, self.tool_calls = reasoning, text, tool_calls
        self.requests: list[dict] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    def _pieces(self) -> list[tuple[str, str]]:
        out = [("reasoning_content", w + " ") for w in self.reasoning.split(" ")]
        return out + [("content", w + " ") for w in self.text.split(" ")] if self.text else out

    async def _chat(self, request: Request):
        body = await request.json()
        self.requests.append(body)
        prompt_ids = list(range(1000, 1000 + len(json.dumps(body["messages"])) // 16 + 1))
        pieces = self._pieces()
        ids = list(range(5000, 5000 + len(pieces) + 1))  # + eos
        finish = "tool_calls" if self.tool_calls else "stop"
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                 "total_tokens": len(prompt_ids) + len(ids)}
        head = {"id": "chatcmpl-r", "object": "chat.completion", "created": 0, "model": body.get("model")}
        if not body.get("stream"):
            msg = {"role": "assistant", "content": "".join(p for k, p in pieces if k == "content") or None,
                   "reasoning_content": "".join(p for k, p in pieces if k == "reasoning_content")}
            if self.tool_calls:
                msg["tool_calls"] = self.tool_calls
            choice = {"index": 0, "message": msg, "finish_reason": finish, "token_ids": ids,
                      "logprobs": {"content": [{"token": "x", "logprob": -0.5} for _ in ids]}}
            return JSONResponse({**head, "choices": [choice], "usage": usage, "prompt_token_ids": prompt_ids})

        def events():
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            yield {**head, "choices": [role], "prompt_token_ids": prompt_ids}
            for i, (kind, piece) in enumerate(pieces):
                yield {**head, "choices": [{"index": 0, "delta": {kind: piece}, "token_ids": [ids[i]],
                                            "logprobs": {"content": [{"token": "x", "logprob": -0.5}]}}]}
            last = {"index": 0, "delta": {}, "finish_reason": finish, "token_ids": [ids[-1]],
                    "logprobs": {"content": [{"token": "x", "logprob": -0.5}]}}
            if self.tool_calls:
                last["delta"] = {"tool_calls": [{"index": i, **tc} for i, tc in enumerate(self.tool_calls)]}
            yield {**head, "choices": [last]}
            yield {**head, "choices": [], "usage": usage}

        async def sse():
            for ev in events():
                yield b"data: " + json.dumps(ev).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")
