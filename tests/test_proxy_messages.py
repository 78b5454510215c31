"""Anthropic Messages through the proxy, with the official anthropic SDK over loopback: translated to upstream chat
completions with token ids (scripted upstream), and passed through natively."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import anthropic
import httpx
import pytest

from proxy.engines.scripted import HTTPError, Text, ToolCall, ToolCalls
from tests.proxy_fixtures import ServeInThread, make_proxy
from tests.reasoning_upstream import ReasoningUpstream

BASH = {"name": "Bash", "description": "Run a bash command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def client(px, token: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=px.url, api_key=token, max_retries=0)


def _tokenize(px, messages, tools=None) -> list[int]:
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    return httpx.post(px.up.url + "/tokenize", json=body).json()["tokens"]


@pytest.fixture
def reasoning(tmp_path):
    double = ReasoningUpstream()
    serve_up = ServeInThread(double.app)
    px, serve = make_proxy(SimpleNamespace(url=serve_up.start(), double=double), tmp_path)
    yield px
    serve.stop()
    px.store.close()
    serve_up.stop()


def test_create_with_system_field_and_system_entries(px, tokenizer):
    px.up.double.script.extend([Text("Hello!")])
    m = client(px, px.register("r1")).messages.create(
        model="m", max_tokens=64, system=[{"type": "text", "text": "You are terse."}],
        messages=[{"role": "user", "content": "hi"}, {"role": "system", "content": "Mid-conversation note."}],
        stop_sequences=["###"], extra_body={"temperature": 0.3, "top_k": 20})  # sampling knobs left this SDK
    assert m.content[0].text == "Hello!" and m.stop_reason == "end_turn" and m.role == "assistant"
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    expected = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"},
                {"role": "system", "content": "Mid-conversation note."}]
    sent = px.up.double.requests[-1].json
    assert sent["messages"] == expected and sent["return_token_ids"] is True
    assert (sent["max_tokens"], sent["temperature"], sent["top_k"], sent["stop"]) == (64, 0.3, 20, ["###"])
    (call,) = px.calls("r1")
    assert call.api_surface == "messages" and call.token_exact and call.messages == expected
    assert call.prompt_token_ids == _tokenize(px, expected) and m.usage.input_tokens == len(call.prompt_token_ids)
    assert tokenizer.decode(call.completion_token_ids).startswith("Hello!")
    assert call.params["max_tokens"] == 64 and "messages" not in call.params and "system" not in call.params


def test_stream_event_sequence(px):
    px.up.double.script.extend([Text("One two three.")])
    with client(px, px.register("r1")).messages.stream(model="m", max_tokens=64,
                                                       messages=[{"role": "user", "content": "count"}]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    raw = [k for k in kinds if k in ("message_start", "content_block_start", "content_block_stop", "message_delta",
                                     "message_stop")]
    assert raw == ["message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == "One two three." and final.stop_reason == "end_turn"
    (call,) = px.calls("r1")
    assert call.streamed and call.token_exact and final.usage.input_tokens == len(call.prompt_token_ids)
    assert final.usage.output_tokens == len(call.completion_token_ids) and call.ttft_ms is not None


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_and_tool_result(px, stream):
    px.up.double.script.extend([ToolCalls([ToolCall("Bash", {"command": "ls"})]), Text("Two files.")])
    c = client(px, px.register("r1"))
    msgs = [{"role": "user", "content": "What is here?"}]

    def ask(messages):
        if not stream:
            return c.messages.create(model="m", max_tokens=128, messages=messages, tools=[BASH])
        with c.messages.stream(model="m", max_tokens=128, messages=messages, tools=[BASH]) as s:
            return s.get_final_message()

    first = ask(msgs)
    (use,) = first.content
    assert first.stop_reason == "tool_use" and use.type == "tool_use" and use.input == {"command": "ls"}
    msgs += [{"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt b.txt"},
                                          {"type": "text", "text": "Summarise."}]}]
    second = ask(msgs)
    assert second.content[0].text == "Two files."
    sent = px.up.double.requests[-1].json
    assert sent["tools"] == [{"type": "function", "function": {"name": "Bash", "parameters": BASH["input_schema"],
                                                               "description": "Run a bash command."}}]
    assert sent["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": use.id, "type": "function", "function": {"name": "Bash", "arguments": '{"command":"ls"}'}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "a.txt b.txt"},
        {"role": "user", "content": "Summarise."}]
    c1, c2 = px.calls("r1")
    assert c1.finish_reason == "tool_calls" and c2.messages[2]["content"] == "a.txt b.txt"
    assert c1.token_exact and c2.token_exact


def test_images_go_to_blobs_and_upstream_gets_a_data_url(px):
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 2
    data = base64.b64encode(png).decode()
    content = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
               {"type": "text", "text": "What is on the screen?"}]
    client(px, px.register("r1")).messages.create(model="m", max_tokens=32,
                                                  messages=[{"role": "user", "content": content}])
    sent = px.up.double.requests[-1].json["messages"][0]["content"]
    assert sent[0] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
    (call,) = px.calls("r1")
    assert px.store.get_blob(call.image_hashes[0]) == png and data not in str(call.messages)


def test_thinking_blocks_out_and_back(reasoning):
    c = client(reasoning, reasoning.register("r1"))
    m = c.messages.create(model="m", max_tokens=256, messages=[{"role": "user", "content": "2+2?"}],
                          thinking={"type": "enabled", "budget_tokens": 1024})
    thinking, text = m.content
    assert thinking.type == "thinking" and thinking.thinking.strip() == "First, 2 + 2 is 4." and thinking.signature
    assert text.text.strip() == "The answer is 4."
    assert reasoning.up.double.requests[-1]["chat_template_kwargs"] == {"enable_thinking": True}
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": [b.model_dump() for b in m.content]},
            {"role": "user", "content": "And 3+3?"}]
    with c.messages.stream(model="m", max_tokens=256, messages=msgs) as s:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in s]
        final = s.get_final_message()
    assert ("content_block_delta", "thinking_delta") in kinds and ("content_block_delta", "signature_delta") in kinds
    assert final.content[0].type == "thinking" and final.content[0].signature
    assert reasoning.up.double.requests[-1]["messages"][1] == {
        "role": "assistant", "content": text.text, "reasoning_content": thinking.thinking}
    c1, c2 = reasoning.calls("r1")
    assert c1.response["reasoning"] == thinking.thinking and c2.token_exact


@pytest.mark.parametrize("script, expected", [
    (Text("a b c d e f g h i j k l m n o p"), "max_tokens"),
    (ToolCalls([ToolCall("Bash", {"command": "ls"})]), "tool_use"),
    (Text("done"), "end_turn"),
])
def test_stop_reasons(px, script, expected):
    px.up.double.script.extend([script, script])
    c = client(px, px.register("r1"))
    kw = dict(model="m", max_tokens=4 if expected == "max_tokens" else 128, tools=[BASH],
              messages=[{"role": "user", "content": "go"}])
    assert c.messages.create(**kw).stop_reason == expected
    with c.messages.stream(**kw) as s:
        assert s.get_final_message().stop_reason == expected


def test_count_tokens_uses_the_upstream_chat_template(px):
    token = px.register("r1")
    msgs = [{"role": "user", "content": "hello there"}]
    n = client(px, token).messages.count_tokens(model="m", messages=msgs, system="Be terse.", tools=[BASH])
    assert n.input_tokens == len(_tokenize(px, [{"role": "system", "content": "Be terse."}, *msgs],
                                           [{"type": "function", "function": {"name": "Bash", "description":
                                                                              "Run a bash command.",
                                                                              "parameters": BASH["input_schema"]}}]))
    r = httpx.post(f"{px.url}/v1/messages/count_tokens?beta=true", headers={"x-api-key": token},
                   json={"model": "m", "messages": "nope"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert px.calls("r1") == []  # counting is not a model call


def test_beta_query_x_api_key_and_path_token(px):
    token = px.register("r1")
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{px.url}/v1/messages?beta=true", json=body,
                   headers={"x-api-key": token, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200 and r.json()["type"] == "message"
    r = httpx.post(f"{px.url}/r/{token}/v1/messages?beta=true", json=body)
    assert r.status_code == 200
    assert len(px.calls("r1")) == 2


def test_errors_are_anthropic_shaped(px):
    token = px.register("r1")
    c = client(px, token)
    with pytest.raises(anthropic.AuthenticationError) as info:
        client(px, "sk-not-a-token").messages.create(model="m", max_tokens=8, messages=[{"role": "user",
                                                                                        "content": "x"}])
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "authentication_error"
    px.up.double.script.extend([HTTPError(400, "This model's maximum context length is 8192 tokens")])
    with pytest.raises(anthropic.BadRequestError, match="maximum context length") as info:
        c.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert info.value.body["error"]["type"] == "invalid_request_error"
    px.up.double.script.extend([HTTPError(500, "engine died", after_chunks=2)])
    with pytest.raises(anthropic.APIStatusError, match="engine died"):
        with c.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "x"}]) as s:
            list(s)
    px.up.server.stop()
    with pytest.raises(anthropic.InternalServerError) as info:
        c.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 502 and info.value.body["error"]["type"] == "api_error"
    calls = px.calls("r1")
    assert [x.error_class for x in calls] == ["upstream_http_400", "upstream_stream_error", "upstream_unreachable"]


def test_native_mode_passes_through_and_records_not_token_exact(tmp_path):
    message = {"id": "msg_up", "type": "message", "role": "assistant", "model": "claude-x", "stop_reason": "tool_use",
               "stop_sequence": None, "usage": {"input_tokens": 11, "output_tokens": 5},
               "content": [{"type": "text", "text": "Let me look."},
                           {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]}
    seen = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        seen.append((scope["path"], json.loads(body)))
        if json.loads(body).get("stream"):
            start = {**message, "content": [], "stop_reason": None, "usage": {"input_tokens": 11, "output_tokens": 0}}
            events = [("message_start", {"message": start}),
                      ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
                      ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Let me look."}}),
                      ("content_block_stop", {"index": 0}),
                      ("content_block_start", {"index": 1, "content_block": {**message["content"][1], "input": {}}}),
                      ("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta",
                                                                     "partial_json": '{"command": "ls"}'}}),
                      ("content_block_stop", {"index": 1}),
                      ("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
                      ("message_stop", {})]
            payload = b"".join(f"event: {k}\ndata: {json.dumps({'type': k, **v})}\n\n".encode() for k, v in events)
            ctype = b"text/event-stream"
        else:
            payload, ctype = json.dumps(message).encode(), b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", ctype)]})
        await send({"type": "http.response.body", "body": payload})

    serve_up = ServeInThread(app)
    px, serve = make_proxy(SimpleNamespace(url=serve_up.start()), tmp_path, proxy_messages_mode="native")
    try:
        c = client(px, px.register("r1"))
        kw = dict(model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "hi"}], tools=[BASH])
        m = c.messages.create(**kw)
        assert m.id == "msg_up" and m.content[1].input == {"command": "ls"}
        with c.messages.stream(**kw) as s:
            assert s.get_final_message().content[1].input == {"command": "ls"}
        assert [p for p, _ in seen] == ["/v1/messages", "/v1/messages"] and seen[0][1]["tools"] == [BASH]
        for call in px.calls("r1"):
            assert call.api_surface == "messages" and not call.token_exact and call.tools == [BASH]
            assert call.response["text"] == "Let me look." and call.finish_reason == "tool_use"
            assert call.response["tool_calls"][0]["function"]["name"] == "Bash"
            assert json.loads(call.response["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}
            assert call.usage == {"prompt_tokens": 11, "completion_tokens": 5}
    finally:
        serve.stop()
        px.store.close()
        serve_up.stop()
