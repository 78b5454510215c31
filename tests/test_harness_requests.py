"""Every request captured from the real harnesses (Codex CLI 0.171.0, Claude Code 2.1.197) is accepted by the
proxy, translated to an upstream chat-completions request with token ids, answered in the harness's own protocol
and recorded. The captures live in ../shared/fixtures/harness-requests/ (one JSON object per line)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from proxy.engines.scripted import ScriptedUpstream, Text, ToolCall, ToolCalls, UpstreamServer
from tests.proxy_fixtures import Up, make_proxy

CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "harness-requests"
_DROP = {"host", "content-length", "authorization", "accept-encoding", "connection", "x-api-key"}


def _captured(name: str) -> list[dict]:
    path = CAPTURES / name
    if not path.exists():
        pytest.skip(f"{path} is not here (the shared fixtures sit beside the checkout)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _posts(name: str) -> list[pytest.param]:
    path = CAPTURES / name
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return [pytest.param(c, id=f"{name.split('-')[0]}-{c['n']}") for c in lines if c["method"] == "POST"]


@pytest.fixture
def big(tokenizer, tmp_path):
    """The proxy in front of a scripted upstream with room for the harnesses' ~20k-token prompts."""
    double = ScriptedUpstream(tokenizer=tokenizer, max_model_len=262_144)
    server = UpstreamServer(double)
    px, serve = make_proxy(Up(double, server.start(), server), tmp_path)
    yield px
    serve.stop()
    px.store.close()
    server.stop()


def _script(px, reply) -> None:
    kind, what = reply
    if kind == "tool":
        name, args, _ = what
        px.up.double.script.extend([ToolCalls([ToolCall(name, json.loads(args))])])
    else:
        px.up.double.script.extend([Text(what)])


def _events(body: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in body.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            out.append((lines.get("event"), json.loads(lines["data"])))
    return out


@pytest.mark.parametrize("capture", _posts("codex-cli-0.171.0.jsonl"))
def test_codex_requests_are_translated(big, capture):
    _script(big, capture["reply"])
    token = big.register("codex")
    headers = {k: v for k, v in capture["headers"].items() if k.lower() not in _DROP}
    r = httpx.post(big.url + capture["path"], content=json.dumps(capture["body"]), timeout=60,
                   headers={**headers, "Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    events = _events(r.content)
    assert events[0][0] == "response.created" and events[-1][0] == "response.completed"
    assert all(name == data["type"] for name, data in events)
    body, sent = capture["body"], big.up.double.requests[-1].json
    declared = [f"{t['name']}.{x['name']}" if t["type"] == "namespace" else t["name"]
                for t in body["tools"] if t["type"] != "web_search" for x in (t.get("tools") or [t])]
    assert [t["function"]["name"] for t in sent["tools"]] == declared  # namespaces flattened in place
    assert sent["return_token_ids"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["tool_choice"] == "auto" and sent["parallel_tool_calls"] is True
    roles = [m["role"] for m in sent["messages"]]
    assert roles[:4] == ["system", "system", "user", "user"]  # two developer messages, then the user's
    if any(i.get("type") == "function_call_output" for i in body["input"]):
        out = next(i for i in body["input"] if i.get("type") == "function_call_output")
        assert roles[4:] == ["assistant", "tool"]
        assert sent["messages"][-1] == {"role": "tool", "tool_call_id": out["call_id"], "content": out["output"]}
        done = [d["item"] for n, d in events if n == "response.output_item.done"]
        assert done[0]["type"] == "message" and done[0]["content"][0]["text"] == capture["reply"][1]
    else:
        done = [d["item"] for n, d in events if n == "response.output_item.done"]
        assert done[0]["type"] == "function_call" and done[0]["name"] == "exec_command"
    (call,) = big.calls("codex")
    assert call.api_surface == "responses" and call.streamed and call.token_exact and call.error_class is None
    assert call.messages == sent["messages"] and call.tools == sent["tools"]
    assert call.metadata["tools_not_forwarded"] == ["web_search"]
    assert call.params["prompt_cache_key"] == body["prompt_cache_key"] and call.params["include"] == body["include"]
    assert "user_agent" not in (call.metadata or {})  # no request header is stored (README)


@pytest.mark.parametrize("capture", _posts("claude-code-2.1.197.jsonl"))
def test_claude_code_requests_are_translated(big, capture):
    _script(big, capture["reply"])
    token = big.register("claude")
    headers = {k: v for k, v in capture["headers"].items() if k.lower() not in _DROP}
    r = httpx.post(big.url + capture["path"], content=json.dumps(capture["body"]), timeout=60,
                   headers={**headers, "x-api-key": token})
    assert r.status_code == 200, r.text
    events = _events(r.content)
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    body, sent = capture["body"], big.up.double.requests[-1].json
    assert [t["function"]["name"] for t in sent["tools"]] == [t["name"] for t in body["tools"]]
    assert sent["max_tokens"] == body["max_tokens"] and sent["return_token_ids"] is True
    assert sent["messages"][0]["role"] == "system" and len(sent["messages"][0]["content"]) == len(body["system"])
    assert [m["role"] for m in sent["messages"]][1:3] == ["user", "system"]  # a role:"system" entry stays in place
    stop = events[-2][1]["delta"]["stop_reason"]
    if capture["reply"][0] == "tool":
        assert stop == "tool_use"
        use = next(d["content_block"] for n, d in events if n == "content_block_start")
        assert use["type"] == "tool_use" and use["name"] == "Bash"
    else:
        result = body["messages"][-1]["content"][0]
        assert stop == "end_turn" and result["type"] == "tool_result"
        assert sent["messages"][-1] == {"role": "tool", "tool_call_id": result["tool_use_id"],
                                        "content": result["content"]}
        assert sent["messages"][-2]["tool_calls"][0]["function"]["name"] == "Bash"
    (call,) = big.calls("claude")
    assert call.api_surface == "messages" and call.streamed and call.token_exact and call.error_class is None
    assert call.messages == sent["messages"] and call.tools == sent["tools"]
    assert call.params["thinking"] == body["thinking"] and call.params["metadata"] == body["metadata"]
    assert "user_agent" not in (call.metadata or {})  # no request header is stored (README)


def test_codex_websocket_attempts_fail_cleanly(big):
    """Codex first tries GET /v1/responses as a websocket; a clean 405 makes it fall back to POST at once."""
    gets = [c for c in _captured("codex-cli-0.171.0.jsonl") if c["method"] == "GET"]
    token = big.register("codex")
    for capture in gets:
        headers = {k: v for k, v in capture["headers"].items() if k.lower() not in _DROP - {"connection"}}
        r = httpx.get(big.url + capture["path"], headers={**headers, "Authorization": f"Bearer {token}"})
        assert r.status_code == 405 and r.json()["error"]["code"] == "websocket_not_supported"
    assert big.up.double.requests == [] and big.calls("codex") == []
