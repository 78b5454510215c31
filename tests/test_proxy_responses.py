"""OpenAI Responses through the proxy, with the official openai SDK over loopback: translated to upstream chat
completions with token ids (scripted upstream), and passed through natively."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import httpx
import openai
import pytest

from proxy.engines.scripted import HTTPError, Text, ToolCall, ToolCalls
from tests.proxy_fixtures import ServeInThread, make_proxy
from tests.reasoning_upstream import ReasoningUpstream

SHELL = {"type": "function", "name": "shell", "description": "Run a shell command.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}


def _tokenize(px, messages, tools=None) -> list[int]:
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    return httpx.post(px.up.url + "/tokenize", json=body).json()["tokens"]


@pytest.fixture
def reasoning(tmp_path):
    """A proxy in front of an upstream that answers with reasoning_content (vLLM with a reasoning parser)."""
    double = ReasoningUpstream()
    serve_up = ServeInThread(double.app)
    up = SimpleNamespace(url=serve_up.start(), double=double)
    px, serve = make_proxy(up, tmp_path)
    yield px
    serve.stop()
    px.store.close()
    serve_up.stop()


def test_create_is_translated_and_recorded_token_exact(px, tokenizer):
    px.up.double.script.extend([Text("Hello, team!")])
    client = px.client(px.register("r1"))
    r = client.responses.create(model="m", input="Say hello.", instructions="Be brief.", temperature=0.5,
                                max_output_tokens=64)
    assert r.output_text == "Hello, team!" and r.status == "completed" and r.id.startswith("resp_")
    assert r.usage.input_tokens > 0 and r.usage.output_tokens == r.usage.total_tokens - r.usage.input_tokens
    sent = px.up.double.requests[-1]
    assert sent.path == "/v1/chat/completions" and sent.json["return_token_ids"] is True
    expected = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
    assert sent.json["messages"] == expected and sent.json["max_tokens"] == 64 and sent.json["temperature"] == 0.5
    (call,) = px.calls("r1")
    assert call.api_surface == "responses" and call.token_exact and not call.streamed
    assert call.messages == expected and call.prompt_token_ids == _tokenize(px, expected)
    assert tokenizer.decode(call.completion_token_ids).startswith("Hello, team!")
    assert len(call.completion_logprobs) == len(call.completion_token_ids)
    assert call.params["max_output_tokens"] == 64 and "input" not in call.params
    assert call.usage["completion_tokens"] == r.usage.output_tokens


@pytest.mark.parametrize("how", ["create", "stream"])
def test_streaming_event_sequence_and_final_response(px, how):
    px.up.double.script.extend([Text("One two three.")])
    client = px.client(px.register("r1"))
    if how == "create":
        events = list(client.responses.create(model="m", input="count", stream=True))
        final = events[-1].response
    else:
        with client.responses.stream(model="m", input="count") as stream:
            events = list(stream)
            final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "One two three." == final.output_text and len(deltas) > 1
    assert final.usage.output_tokens > 0
    (call,) = px.calls("r1")
    assert call.streamed and call.token_exact and call.response["text"] == "One two three."
    assert call.ttft_ms is not None and call.usage["completion_tokens"] == final.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_function_tool_call_round_trip(px, stream):
    px.up.double.script.extend([ToolCalls([ToolCall("shell", {"cmd": "ls -la"})]), Text("Two files.")])
    client = px.client(px.register("r1"))
    inp = [{"role": "user", "content": "What is here?"}]
    if stream:
        with client.responses.stream(model="m", input=inp, tools=[SHELL]) as s:
            events = list(s)
            first = s.get_final_response()
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    else:
        first = client.responses.create(model="m", input=inp, tools=[SHELL])
    (fc,) = first.output
    assert fc.type == "function_call" and fc.name == "shell" and '"ls -la"' in fc.arguments and fc.call_id
    inp += [fc.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": fc.call_id,
                                               "output": "a.txt b.txt"}]
    second = client.responses.create(model="m", input=inp, tools=[SHELL], stream=stream)
    if stream:
        second = [e for e in second][-1].response
    assert second.output_text == "Two files."
    sent = px.up.double.requests[-1].json
    assert sent["tools"] == [{"type": "function", "function": {"name": "shell", "description": "Run a shell command.",
                                                               "parameters": SHELL["parameters"]}}]
    assert sent["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": fc.call_id, "type": "function", "function": {"name": "shell", "arguments": fc.arguments}}]},
        {"role": "tool", "tool_call_id": fc.call_id, "content": "a.txt b.txt"}]
    c1, c2 = px.calls("r1")
    assert c1.finish_reason == "tool_calls" and c1.tool_schema_hash and c2.tool_schema_hash == c1.tool_schema_hash
    assert c2.messages[-1]["content"] == "a.txt b.txt" and c1.token_exact and c2.token_exact
    # the second prompt extends the first prompt + completion, token for token (what training needs)
    assert c2.prompt_token_ids[:len(c1.prompt_token_ids)] == c1.prompt_token_ids


def test_strict_and_unknown_tool_keys_are_not_lost(px):
    """pydantic-ai sends ``"strict": true``: it reaches the upstream's chat tool and the stored tools; a key the
    translation does not know is named in the call's metadata."""
    strict = {**SHELL, "strict": True, "x-vendor": 1}
    px.up.double.script.extend([Text("ok")])
    px.client(px.register("r1")).responses.create(model="m", input="go", tools=[strict])
    (tool,) = px.up.double.requests[-1].json["tools"]
    assert tool["function"]["strict"] is True and tool["function"]["parameters"] == SHELL["parameters"]
    (call,) = px.calls("r1")
    assert call.tools[0]["function"]["strict"] is True, call.tools
    assert call.metadata["tool_keys_not_forwarded"] == ["shell.x-vendor"]


def test_namespace_custom_and_hosted_tools(px):
    tools = [{"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
                 {"type": "function", "name": "spawn", "parameters": {"type": "object", "properties": {}}}]},
             {"type": "custom", "name": "apply_patch", "description": "Apply a patch.",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
             {"type": "web_search", "external_web_access": False}]
    px.up.double.script.extend([ToolCalls([ToolCall("agents.spawn", {}), ToolCall("apply_patch",
                                                                                 {"input": "*** Begin Patch"})])])
    r = px.client(px.register("r1")).responses.create(model="m", input="go", tools=tools)
    spawn, patch = r.output
    assert (spawn.type, spawn.name, spawn.namespace) == ("function_call", "spawn", "agents")
    assert (patch.type, patch.name, patch.input) == ("custom_tool_call", "apply_patch", "*** Begin Patch")
    sent = px.up.double.requests[-1].json
    assert [t["function"]["name"] for t in sent["tools"]] == ["agents.spawn", "apply_patch"]
    assert "start: /.+/" in sent["tools"][1]["function"]["parameters"]["properties"]["input"]["description"]
    (call,) = px.calls("r1")
    assert call.metadata["tools_not_forwarded"] == ["web_search"]


def test_reasoning_items_and_encrypted_content_round_trip(reasoning):
    client = reasoning.client(reasoning.register("r1"))
    up = reasoning.up.double
    r = client.responses.create(model="m", input="2+2?", include=["reasoning.encrypted_content"])
    rs, msg = r.output
    assert rs.type == "reasoning" and rs.content[0].text.strip() == "First, 2 + 2 is 4." and rs.encrypted_content
    assert msg.type == "message" and r.output_text.strip() == "The answer is 4."
    # the client sends the reasoning item back with only its encrypted_content, byte for byte as it got it
    back = {"type": "reasoning", "id": rs.id, "summary": [], "encrypted_content": rs.encrypted_content}
    inp = ["2+2?", back, msg.model_dump(exclude_none=True), {"role": "user", "content": "And 3+3?"}]
    inp[0] = {"role": "user", "content": "2+2?"}
    with client.responses.stream(model="m", input=inp, include=["reasoning.encrypted_content"]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.reasoning_text.delta" in kinds and final.output[0].encrypted_content
    assert up.requests[-1]["messages"][1] == {"role": "assistant", "content": r.output_text,
                                              "reasoning_content": rs.content[0].text}
    c1, c2 = reasoning.calls("r1")
    assert c1.response["reasoning"] == rs.content[0].text and c2.token_exact
    assert c2.messages[1]["reasoning_content"] == rs.content[0].text


def test_foreign_encrypted_reasoning_is_noted_not_forwarded(px):
    inp = [{"role": "user", "content": "hi"}, {"type": "reasoning", "id": "rs_x", "summary": [],
                                                "encrypted_content": "gAAAAB-opaque-from-elsewhere"},
           {"role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
           {"role": "user", "content": "again"}]
    px.client(px.register("r1")).responses.create(model="m", input=inp)
    assert px.up.double.requests[-1].json["messages"][1] == {"role": "assistant", "content": "hello"}
    assert px.calls("r1")[0].metadata["reasoning_items_not_forwarded"] == 1


def test_previous_response_id_continues_the_conversation(px):
    token = px.register("r1")
    client = px.client(token)
    first = client.responses.create(model="m", input="My name is Ada.", instructions="Be kind.")
    second = client.responses.create(model="m", input="What is my name?", previous_response_id=first.id,
                                     instructions="Be kind.")
    assert second.previous_response_id == first.id
    assert px.up.double.requests[-1].json["messages"] == [
        {"role": "system", "content": "Be kind."}, {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "What is my name?"}]
    # scoped to the rollout, and not kept with store: false
    other = px.client(px.register("r2"))
    with pytest.raises(openai.BadRequestError, match="not known to this proxy"):
        other.responses.create(model="m", input="x", previous_response_id=first.id)
    unstored = client.responses.create(model="m", input="secret", store=False)
    with pytest.raises(openai.BadRequestError, match="previous_response_not_found|not known"):
        client.responses.create(model="m", input="x", previous_response_id=unstored.id)


def test_images_go_to_blobs(px):
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 2
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    inp = [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                        {"type": "input_image", "image_url": url, "detail": "low"}]}]
    px.client(px.register("r1")).responses.create(model="m", input=inp)
    assert px.up.double.requests[-1].json["messages"][0]["content"][1] == {
        "type": "image_url", "image_url": {"url": url, "detail": "low"}}
    (call,) = px.calls("r1")
    assert px.store.get_blob(call.image_hashes[0]) == png and base64.b64encode(png).decode() not in str(call.messages)


def test_length_cut_is_incomplete(px):
    px.up.double.script.extend([Text("word " * 50), Text("word " * 50)])
    client = px.client(px.register("r1"))
    r = client.responses.create(model="m", input="talk", max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    events = list(client.responses.create(model="m", input="talk", max_output_tokens=5, stream=True))
    assert events[-1].type == "response.incomplete"


def test_unknown_fields_go_upstream_and_everything_is_recorded(px):
    px.client(px.register("r1")).responses.create(
        model="m", input="hi", store=False, prompt_cache_key="k1", reasoning={"effort": "low", "summary": "auto"},
        extra_body={"top_k": 5, "repetition_penalty": 1.1})
    sent = px.up.double.requests[-1].json
    assert sent["top_k"] == 5 and sent["repetition_penalty"] == 1.1 and sent["reasoning_effort"] == "low"
    assert "prompt_cache_key" not in sent and "store" not in sent
    (call,) = px.calls("r1")
    assert call.params["prompt_cache_key"] == "k1" and call.params["top_k"] == 5 and call.params["store"] is False


def test_upstream_errors_are_responses_shaped(px):
    client = px.client(px.register("r1"))
    px.up.double.script.extend([HTTPError(400, "This model's maximum context length is 8192 tokens")])
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.responses.create(model="m", input="hi")
    px.up.double.script.extend([HTTPError(500, "engine died", after_chunks=2)])
    events = list(client.responses.create(model="m", input="hi", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.failed"
    assert "engine died" in events[-1].response.error.message
    px.up.double.script.extend([Text("cut short by a crash", disconnect_after=3)])
    events = list(client.responses.create(model="m", input="hi", stream=True))
    assert events[-1].type == "response.failed"
    calls = px.calls("r1")
    assert [c.error_class for c in calls][:2] == ["upstream_http_400", "upstream_stream_error"]
    assert calls[2].error_class in ("upstream_stream_truncated", "upstream_unreachable")
    assert not any(c.token_exact for c in calls)


def test_websocket_attempt_fails_cleanly(px):
    token = px.register("r1")
    r = httpx.get(px.url + "/v1/responses", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 405 and r.json()["error"]["code"] == "websocket_not_supported"
    ws = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
          "Sec-WebSocket-Key": "IaOeYm+pZHDxHT+hW8CGSQ==", "Authorization": f"Bearer {token}"}
    r = httpx.get(px.url + "/v1/responses", headers=ws)
    assert r.status_code == 405 and "HTTP POST" in r.json()["error"]["message"]


def test_path_token_route(px):
    token = px.register("r1")
    r = httpx.post(f"{px.url}/r/{token}/v1/responses", json={"model": "m", "input": "hi"})
    assert r.status_code == 200 and r.json()["object"] == "response"
    assert len(px.calls("r1")) == 1


def test_native_mode_passes_through_and_records_not_token_exact(tmp_path):
    """A hosted upstream's own /v1/responses: body and answer unchanged, recorded without token ids."""
    answer = {"id": "resp_up", "object": "response", "status": "completed", "model": "gpt-x", "output": [
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Native hi.", "annotations": []}]}],
        "usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}}
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
        seen.append((scope["path"], body))
        stream = b'"stream":true' in body
        if stream:
            item, part = answer["output"][0], answer["output"][0]["content"][0]
            at = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
            events = [("response.created", {"response": {**answer, "status": "in_progress", "output": []}}),
                      ("response.output_item.added", {"output_index": 0, "item": {**item, "content": []}}),
                      ("response.content_part.added", {**at, "part": {**part, "text": ""}}),
                      ("response.output_text.delta", {**at, "delta": "Native hi."}),
                      ("response.output_item.done", {"output_index": 0, "item": item}),
                      ("response.completed", {"response": answer})]
            events = [(k, {"type": k, "sequence_number": i, **v}) for i, (k, v) in enumerate(events)]
            payload = b"".join(f"event: {k}\ndata: {json.dumps(v)}\n\n".encode() for k, v in events)
            ctype = b"text/event-stream"
        else:
            payload, ctype = json.dumps(answer).encode(), b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", ctype)]})
        await send({"type": "http.response.body", "body": payload})

    serve_up = ServeInThread(app)
    up = SimpleNamespace(url=serve_up.start())
    px, serve = make_proxy(up, tmp_path, proxy_responses_mode="native")
    try:
        client = px.client(px.register("r1"))
        r = client.responses.create(model="gpt-x", input="hi", store=False)
        assert r.output_text == "Native hi." and r.id == "resp_up"
        with client.responses.stream(model="gpt-x", input="hi") as s:
            assert s.get_final_response().output_text == "Native hi."
        assert [p for p, _ in seen] == ["/v1/responses", "/v1/responses"]
        assert b'"store":false' in seen[0][1] and b"return_token_ids" not in seen[0][1]
        c1, c2 = px.calls("r1")
        for c in (c1, c2):
            assert c.api_surface == "responses" and not c.token_exact and c.response["text"] == "Native hi."
            assert c.metadata["upstream_api"] == "responses" and c.usage["prompt_tokens"] == 7
        assert c2.streamed and c1.messages == [{"role": "user", "content": "hi"}]
    finally:
        serve.stop()
        px.store.close()
        serve_up.stop()
