"""`PromptLogprobServer`: a stand-in for a vLLM OpenAI server that scores prompts (`prompt_logprobs`), over real
loopback HTTP, for the `vllm-served` re-scorer's default-tier tests.

It answers what the scorer asks, in vLLM 0.32's shapes: `GET /v1/models` (`id`, `root`, `max_model_len`),
`GET /version`, `GET /server_info?config_format=json` (dev mode: `vllm_config.model_config.dtype`) and
`POST /v1/completions` with a token-id `prompt` and `prompt_logprobs: 0`, whose `choices[0].prompt_logprobs` is
`[None, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]`, one entry per prompt token. A token's logprob is
`logprob(previous id, id)`, a fixed function, so a test knows every expected value. Errors are vLLM's JSON
(`{"error": {"message", "type", "code"}}`): 404 for a model it does not serve, 400 for a prompt longer than
`max_model_len`. Knobs for the failure paths: `fail_after` (answers 500 once that many completions were served),
`short` (drops the last prompt logprob), `dev_mode` (no `/server_info` without it), `before_answer` (called with
each completion request before it is answered: a test changes the world there).

The scripted engine (`proxy.engines.scripted`) does not score prompts, and a shipped module may not carry a test
double; this one is stdlib `http.server` (threads: the scorer sends several requests at once).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["PromptLogprobServer", "logprob"]


def logprob(prev: int, tok: int) -> float:
    """The double's model: log p(tok | ... prev), in (-10, 0]."""
    return -((prev * 31 + tok * 7) % 997) / 100.0


class PromptLogprobServer:
    """``with PromptLogprobServer(model="m") as s: s.url``; ``s.requests`` holds each completion request's body."""

    def __init__(self, *, model: str = "m", max_model_len: int = 4096, version: str = "0.32.0",
                 dev_mode: bool = True, fail_after: int | None = None, short: bool = False,
                 before_answer: Callable[[dict], None] | None = None):
        self.model, self.max_model_len, self.version, self.dev_mode = model, max_model_len, version, dev_mode
        self.fail_after, self.short, self.before_answer = fail_after, short, before_answer
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> PromptLogprobServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def complete(self, body: dict) -> tuple[int, dict]:
        if body.get("model") != self.model:
            return 404, _error(f"The model `{body.get('model')}` does not exist.", "NotFoundError", 404)
        ids = body.get("prompt")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            return 400, _error("this double takes a token-id prompt only", "BadRequestError", 400)
        if len(ids) + int(body.get("max_tokens") or 16) > self.max_model_len:
            return 400, _error(f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                               f"request has {len(ids)} input tokens.", "BadRequestError", 400)
        with self._lock:
            if self.fail_after is not None and len(self.requests) >= self.fail_after:
                return 500, _error("EngineCore encountered an issue.", "InternalServerError", 500)
            self.requests.append(body)
        if self.before_answer is not None:
            self.before_answer(body)
        scored = None
        if body.get("prompt_logprobs") is not None:
            scored = [None] + [{str(t): {"logprob": logprob(p, t), "rank": 1, "decoded_token": f"<{t}>"}}
                               for p, t in zip(ids, ids[1:])]
            if self.short:
                scored = scored[:-1]
        return 200, {"id": "cmpl-double", "object": "text_completion", "model": self.model,
                     "choices": [{"index": 0, "text": "x", "logprobs": None, "finish_reason": "length",
                                  "stop_reason": None, "prompt_logprobs": scored}],
                     "usage": {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}}

    def _get(self, path: str) -> tuple[int, dict]:
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "vllm",
                                                     "root": f"/models/{self.model}",
                                                     "max_model_len": self.max_model_len}]}
        if path == "/version":
            return 200, {"version": self.version}
        if path == "/server_info" and self.dev_mode:
            return 200, {"vllm_config": {"model_config": {"dtype": "torch.float32"}}}
        return 404, {"detail": "Not Found"}

    def _handler(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send(*outer._get(self.path.split("?")[0]))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                if self.path != "/v1/completions":
                    self._send(404, {"detail": "Not Found"})
                    return
                self._send(*outer.complete(body))

        return Handler


def _error(message: str, kind: str, code: int) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
