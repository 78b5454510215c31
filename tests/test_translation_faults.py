"""Bad input on the Responses and Messages routes: malformed, truncated or mistyped bodies get that API's error
shape (OpenAI ``{"error": {...}}``, Anthropic ``{"type": "error", "error": {...}}``), never a 500."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import httpx
import pytest

CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "harness-requests"
RESPONSES = {"model": "m", "stream": True, "instructions": "Be brief.", "input": [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\": \"ls\"}"},
    {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]}],
    "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}},
              {"type": "namespace", "name": "ns", "description": "d", "tools": [{"type": "function", "name": "f"}]}],
    "reasoning": {"effort": "low"}, "text": {"format": {"type": "text"}}, "include": ["reasoning.encrypted_content"]}
MESSAGES = {"model": "m", "max_tokens": 32, "stream": True, "system": [{"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                         {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                                           {"type": "tool_use", "id": "t1", "name": "Bash",
                                                            "input": {"command": "ls"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                       "content": [{"type": "text", "text": "a.txt"}]}]}],
            "tools": [{"name": "Bash", "input_schema": {"type": "object", "properties": {}}}],
            "tool_choice": {"type": "auto"}, "thinking": {"type": "enabled", "budget_tokens": 8}}


def _post(px, path: str, body, token: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(px.url + path, content=content, timeout=30,
                      headers={"Authorization": f"Bearer {token}", "content-type": "application/json"})


def _shaped(r: httpx.Response, path: str) -> None:
    """An error in the route's own API shape (a 2xx answer is fine too: the fuzzed body was still valid)."""
    assert r.status_code < 500 or r.status_code in (502, 504), (r.status_code, r.text[:300])
    if r.status_code < 400:
        return
    body = r.json()
    if "messages" in path:
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"]), body


@pytest.mark.parametrize("path, body, fragment", [
    ("/v1/responses", b'{"model": "m", "input": [', "not valid JSON"),
    ("/v1/responses", b"[1, 2]", "not an object"),
    ("/v1/responses", {"model": "m"}, "'input' is required"),
    ("/v1/responses", {"model": "m", "input": 5}, "'input' must be"),
    ("/v1/responses", {"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
    ("/v1/responses", {"model": "m", "input": [{"role": "wizard", "content": "x"}]}, "role 'wizard'"),
    ("/v1/responses", {"model": "m", "input": [{"type": "function_call", "name": "f"}]}, "call_id"),
    ("/v1/responses", {"model": "m", "input": "x", "tools": "all"}, "'tools'"),
    ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input_file"),
    ("/v1/messages", b'{"model": "m", "messages": [{"role": "us', "not valid JSON"),
    ("/v1/messages", {"model": "m"}, "messages: Field required"),
    ("/v1/messages", {"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": 7}]}, "messages.0.content"),
    ("/v1/messages", {"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": [{"type": "audio"}]}]}, "'audio'"),
    ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}, "base64 or url source"),
    ("/v1/messages/count_tokens", {"model": "m", "messages": {"role": "user"}}, "messages"),
])
def test_malformed_bodies_get_the_apis_own_400(px, path, body, fragment):
    r = _post(px, path, body, px.register("r1"))
    assert r.status_code == 400, r.text
    _shaped(r, path)
    message = r.json()["error"]["message"]
    assert fragment in message, message
    assert px.up.double.requests == []  # nothing was forwarded


@pytest.mark.parametrize("path, capture", [("/v1/responses", "codex-cli-0.171.0.jsonl"),
                                           ("/v1/messages?beta=true", "claude-code-2.1.197.jsonl")])
def test_truncated_bodies_are_400_in_shape(px, path, capture):
    lines = (CAPTURES / capture).read_text().splitlines() if (CAPTURES / capture).exists() else []
    raw = json.dumps(next(json.loads(x)["body"] for x in lines if '"POST"' in x)).encode() if lines else json.dumps(
        RESPONSES if "responses" in path else MESSAGES).encode()
    token = px.register("r1")
    for cut in sorted({1, 2, 10, 100, len(raw) // 3, len(raw) // 2, len(raw) - 2, len(raw) - 1}):
        r = _post(px, path, raw[:cut], token)
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"], (cut, r.text[:200])
        _shaped(r, path)
    assert px.up.double.requests == []


def _mutations(body: dict, seed: int, n: int):
    """Copies of ``body`` with one node swapped for a value of another type (deterministic)."""
    rng = random.Random(seed)
    paths = []

    def walk(node, path):
        paths.append(path)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            walk(v, path + [k])

    walk(body, [])
    junk = [None, 0, -1, 3.5, True, "", "x", [], [1], {}, {"type": "bogus"}, [{"type": None}]]
    for _ in range(n):
        path, value = rng.choice(paths[1:]), rng.choice(junk)
        out = copy.deepcopy(body)
        node = out
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        yield out


@pytest.mark.parametrize("path, body", [("/v1/responses", RESPONSES), ("/v1/messages", MESSAGES)])
def test_mistyped_bodies_never_500(px, path, body):
    token = px.register("r1")
    for mutated in _mutations(body, seed=7, n=60):
        r = _post(px, path, mutated, token)
        _shaped(r, path)
