"""The Gemini API through the proxy, with the official google-genai SDK over loopback: translated to upstream chat
completions with token ids (scripted engine), recorded token-exactly like the other protocols, errors in Google's
shape."""

from __future__ import annotations

import base64

import anthropic
import httpx
import orjson
import pytest
from google import genai
from google.genai import errors, types

from proxy.engines.scripted import HTTPError, Text, ToolCall, ToolCalls

BASH_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
BASH = types.FunctionDeclaration(name="Bash", description="Run a bash command.", parameters=types.Schema(
    type=types.Type.OBJECT, properties={"command": types.Schema(type=types.Type.STRING)}, required=["command"]))
GEN = "/v1beta/models/gemini-2.5-flash:generateContent"


@pytest.fixture
def gemini(px):
    """``gemini(token)``: the SDK's models API through the proxy (its clients kept open until the test ends: a client
    closes its connection pool when it is collected)."""
    made: list[genai.Client] = []

    def models(token: str):
        made.append(genai.Client(api_key=token, http_options=types.HttpOptions(base_url=px.url)))
        return made[-1].models

    yield models
    for c in made:
        c.close()


def _tokenize(px, messages, tools=None) -> list[int]:
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    return httpx.post(px.up.url + "/tokenize", json=body).json()["tokens"]


def test_generate_content_is_translated_and_recorded_token_exactly(px, tokenizer, gemini):
    px.up.double.script.extend([Text("Hello!")])
    r = gemini(px.register("r1")).generate_content(
        model="gemini-2.5-flash", contents="hi", config=types.GenerateContentConfig(
            system_instruction="You are terse.", temperature=0.3, top_p=0.9, top_k=20, max_output_tokens=64,
            stop_sequences=["###"], seed=7))
    assert r.text == "Hello!" and r.candidates[0].finish_reason == types.FinishReason.STOP
    assert r.model_version == "gemini-2.5-flash"
    expected = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
    sent = px.up.double.requests[-1].json
    assert sent["messages"] == expected and sent["return_token_ids"] is True and sent["model"] == "gemini-2.5-flash"
    assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["max_tokens"], sent["stop"], sent["seed"]) == (
        0.3, 0.9, 20, 64, ["###"], 7)
    (call,) = px.calls("r1")
    assert call.api_surface == "gemini" and call.token_exact and not call.streamed and call.messages == expected
    assert call.prompt_token_ids == _tokenize(px, expected)
    assert r.usage_metadata.prompt_token_count == len(call.prompt_token_ids)
    assert r.usage_metadata.candidates_token_count == len(call.completion_token_ids)
    assert tokenizer.decode(call.completion_token_ids).startswith("Hello!")
    assert call.params["model"] == "gemini-2.5-flash" and call.params["generationConfig"]["topK"] == 20
    assert "contents" not in call.params and "systemInstruction" not in call.params


def test_generate_content_stream(px, gemini):
    px.up.double.script.extend([Text("One two three four five.")])
    chunks = list(gemini(px.register("r1")).generate_content_stream(model="gemini-2.5-flash",
                                                                               contents="count"))
    assert len(chunks) > 1 and "".join(c.text or "" for c in chunks) == "One two three four five."
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    (call,) = px.calls("r1")
    assert call.streamed and call.token_exact and call.ttft_ms is not None and call.error_class is None
    assert chunks[-1].usage_metadata.prompt_token_count == len(call.prompt_token_ids)
    assert chunks[-1].usage_metadata.candidates_token_count == len(call.completion_token_ids)
    assert px.up.double.requests[-1].json["stream"] is True


def test_the_stream_is_sse_data_events_without_names_or_done(px):
    px.up.double.script.extend([Text("Hi there.")])
    token = px.register("r1")
    with httpx.stream("POST", px.url + "/v1beta/models/m:streamGenerateContent?alt=sse",
                      headers={"x-goog-api-key": token}, json={"contents": [{"parts": [{"text": "hi"}]}]}) as r:
        raw = r.read()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in raw.split(b"\r\n\r\n") if e]
    assert all(e.startswith(b"data: {") for e in events) and b"event:" not in raw and b"[DONE]" not in raw
    assert orjson.loads(events[-1][6:])["candidates"][0]["finishReason"] == "STOP"


def test_a_stream_without_alt_sse_is_one_json_array(px):
    px.up.double.script.extend([Text("Hi there.")])
    r = httpx.post(px.url + "/v1beta/models/m:streamGenerateContent", headers={"x-goog-api-key": px.register("r1")},
                   json={"contents": [{"parts": [{"text": "hi"}]}]})
    items = r.json()
    assert r.status_code == 200 and isinstance(items, list) and items[-1]["candidates"][0]["finishReason"] == "STOP"
    assert "".join(p.get("text", "") for i in items for p in i["candidates"][0]["content"]["parts"]) == "Hi there."


@pytest.mark.parametrize("stream", [False, True])
def test_function_calling(px, stream, gemini):
    px.up.double.script.extend([ToolCalls([ToolCall("Bash", {"command": "ls"})]), Text("Two files.")])
    c = gemini(px.register("r1"))
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[BASH])],
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode="AUTO")),
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    contents = [types.Content(role="user", parts=[types.Part(text="What is here?")])]

    def ask():
        if not stream:
            return c.generate_content(model="gemini-2.5-flash", contents=contents, config=config)
        chunks = list(c.generate_content_stream(model="gemini-2.5-flash", contents=contents, config=config))
        parts = [p for ch in chunks for p in (ch.candidates[0].content.parts or [])]
        return types.GenerateContentResponse(candidates=[types.Candidate(
            content=types.Content(role="model", parts=parts), finish_reason=chunks[-1].candidates[0].finish_reason)])

    first = ask()
    (fc,) = first.function_calls
    assert fc.name == "Bash" and fc.args == {"command": "ls"} and fc.id
    contents += [first.candidates[0].content, types.Content(role="user", parts=[
        types.Part.from_function_response(name="Bash", response={"output": "a.txt b.txt"}),
        types.Part(text="Summarise.")])]
    second = ask()
    assert second.text == "Two files."
    sent = px.up.double.requests[-1].json
    assert sent["tools"] == [{"type": "function", "function": {"name": "Bash", "description": "Run a bash command.",
                                                               "parameters": BASH_SCHEMA}}]
    assert sent["tool_choice"] == "auto"
    call_id = sent["messages"][1]["tool_calls"][0]["id"]
    assert sent["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "Bash", "arguments": '{"command":"ls"}'}}]},
        {"role": "tool", "tool_call_id": call_id, "content": '{"output":"a.txt b.txt"}'},
        {"role": "user", "content": "Summarise."}]
    c1, c2 = px.calls("r1")
    assert c1.finish_reason == "tool_calls" and c1.token_exact and c2.token_exact
    assert c2.prompt_token_ids == _tokenize(px, sent["messages"], sent["tools"])


def test_function_calls_without_ids_get_stable_ones_and_responses_find_them(px):
    px.up.double.script.extend([Text("ok"), Text("ok")])
    token = px.register("r1")
    body = {"contents": [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [{"text": "thinking...", "thought": True},
                                    {"functionCall": {"name": "a", "args": {}}},
                                    {"functionCall": {"name": "b", "args": {"x": 1}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "b", "response": {"r": 2}}},
                                   {"functionResponse": {"name": "a", "response": {"r": 1}}}]}],
        "tools": [{"functionDeclarations": [{"name": "a"}, {"name": "b", "parametersJsonSchema": BASH_SCHEMA}]}]}
    for _ in range(2):
        assert httpx.post(px.url + GEN, headers={"x-goog-api-key": token}, json=body).status_code == 200
    first, second = (r.json["messages"] for r in px.up.double.requests[-2:])
    assert first == second  # the ids are the same from call to call: the next prompt extends this one
    assert first[1]["reasoning_content"] == "thinking..."
    assert [t["id"] for t in first[1]["tool_calls"]] == ["call_1_1", "call_1_2"]
    assert [(m["tool_call_id"], m["content"]) for m in first[2:]] == [("call_1_2", '{"r":2}'), ("call_1_1", '{"r":1}')]
    tools = px.up.double.requests[-1].json["tools"]
    assert tools[0]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert tools[1]["function"]["parameters"] == BASH_SCHEMA


def test_one_tool_hashes_the_same_through_every_api(px, gemini):
    """The tool-schema hash is the hash of the chat tool the upstream sees, so one tool declared through the four
    APIs is one schema in the store."""
    px.up.double.script.extend([Text("ok")] * 4)
    token = px.register("r1")
    px.client(token).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=[
        {"type": "function", "function": {"name": "Bash", "description": "Run a bash command.",
                                          "parameters": BASH_SCHEMA}}])
    px.client(token).responses.create(model="m", input="hi", tools=[
        {"type": "function", "name": "Bash", "description": "Run a bash command.", "parameters": BASH_SCHEMA}])
    anthropic.Anthropic(base_url=px.url, api_key=token, max_retries=0).messages.create(
        model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}], tools=[
            {"name": "Bash", "description": "Run a bash command.", "input_schema": BASH_SCHEMA}])
    gemini(token).generate_content(model="m", contents="hi", config=types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[BASH])]))
    calls = px.calls("r1")
    assert [c.api_surface for c in calls] == ["chat.completions", "responses", "messages", "gemini"]
    assert len({c.tool_schema_hash for c in calls}) == 1 and calls[0].tool_schema_hash


def test_inline_images_go_to_blobs(px, gemini):
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 2
    gemini(px.register("r1")).generate_content(model="m", contents=[
        types.Part.from_bytes(data=png, mime_type="image/png"), "What is on the screen?"])
    data = base64.b64encode(png).decode()
    sent = px.up.double.requests[-1].json["messages"][0]["content"]
    assert sent[0] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
    (call,) = px.calls("r1")
    assert px.store.get_blob(call.image_hashes[0]) == png and data not in str(call.messages)


def test_count_tokens(px, gemini):
    token = px.register("r1")
    n = gemini(token).count_tokens(model="gemini-2.5-flash", contents="Say hello.").total_tokens
    assert n == len(_tokenize(px, [{"role": "user", "content": "Say hello."}]))
    r = httpx.post(px.url + "/v1beta/models/m:countTokens?key=" + token, json={"generateContentRequest": {
        "model": "models/m", "contents": [{"role": "user", "parts": [{"text": "Say hello."}]}]}})
    assert r.status_code == 200 and r.json() == {"totalTokens": n}
    r = httpx.post(px.url + "/v1beta/models/m:countTokens", json={"contents": []})
    assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"


def test_the_key_comes_from_the_header_the_query_or_the_path(px):
    px.up.double.script.extend([Text("ok")] * 3)
    token, body = px.register("r1"), {"contents": [{"parts": [{"text": "hi"}]}]}
    for url, headers in ((px.url + GEN, {"x-goog-api-key": token}), (px.url + GEN + "?key=" + token, {}),
                         (px.url + f"/r/{token}" + GEN, {})):
        r = httpx.post(url, headers=headers, json=body)
        assert r.status_code == 200 and r.json()["candidates"][0]["content"]["parts"] == [{"text": "ok"}], url
    assert len(px.calls("r1")) == 3


def test_errors_take_googles_shape(px, gemini):
    with pytest.raises(errors.ClientError) as bad_key:
        gemini("not-a-token").generate_content(model="m", contents="hi")
    assert bad_key.value.code == 401 and bad_key.value.status == "UNAUTHENTICATED"
    token = px.register("r1")
    with pytest.raises(errors.ClientError) as two:
        gemini(token).generate_content(model="m", contents="hi",
                                                  config=types.GenerateContentConfig(candidate_count=2))
    assert two.value.code == 400 and two.value.status == "INVALID_ARGUMENT" and "candidateCount" in two.value.message
    r = httpx.post(px.url + GEN, headers={"x-goog-api-key": token},
                   json={"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"temprature": 0.2}})
    err = r.json()["error"]
    assert r.status_code == 400 and err["status"] == "INVALID_ARGUMENT" and err["code"] == 400
    assert '"temprature"' in err["message"] and err["details"][0]["reason"] == "unknown_field"
    r = httpx.post(px.url + GEN, headers={"x-goog-api-key": token}, json={"contents": [{"parts": [{"inlineData": {
        "mimeType": "audio/wav", "data": "AAAA"}}]}]})
    assert r.status_code == 400 and "audio/wav" in r.json()["error"]["message"]
    assert httpx.post(px.url + "/v1beta/models/m:embedContent", json={}).json()["error"]["status"] == "NOT_FOUND"
    assert px.calls("r1") == []  # refused before anything went upstream


def test_upstream_failures_are_passed_on_in_googles_shape(px, gemini):
    px.up.double.script.extend([HTTPError(503, "engine overloaded"), HTTPError(500, "engine died", after_chunks=2),
                                Text("One two three four five six.", disconnect_after=2)])
    models = gemini(px.register("r1"))
    with pytest.raises(errors.ServerError) as exc:
        models.generate_content(model="m", contents="hi")
    assert exc.value.code == 503 and exc.value.status == "UNAVAILABLE" and "engine overloaded" in exc.value.message
    for expected in ("engine died", "closed the connection"):  # mid-stream: an error event, last
        with pytest.raises(errors.APIError, match=expected):
            list(models.generate_content_stream(model="m", contents="hi"))
    px.up.server.stop()
    with pytest.raises(errors.ServerError) as exc:
        models.generate_content(model="m", contents="hi")
    assert exc.value.code == 502 and exc.value.status == "UNAVAILABLE"
    calls = px.calls("r1")
    assert [c.error_class for c in calls] == ["upstream_http_503", "upstream_stream_error",
                                              "upstream_unreachable", "upstream_unreachable"]
    assert calls[2].response["text"].startswith("One")  # what the client was sent is kept


def test_what_has_no_chat_knob_is_listed_in_the_metadata(px):
    px.up.double.script.extend([Text("{}")])
    r = httpx.post(px.url + GEN, headers={"x-goog-api-key": px.register("r1")}, json={
        "contents": [{"parts": [{"text": "hi"}]}],
        "tools": [{"googleSearch": {}}, {"function_declarations": [{"name": "f", "behavior": "BLOCKING"}]}],
        "safety_settings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
        "generation_config": {"response_logprobs": True, "response_mime_type": "application/json",
                              "thinking_config": {"thinking_budget": 0}}})
    assert r.status_code == 200, r.text
    sent = px.up.double.requests[-1].json
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["chat_template_kwargs"] == {"enable_thinking": False}
    (call,) = px.calls("r1")
    assert call.metadata["tools_not_forwarded"] == ["googleSearch"]
    assert call.metadata["tool_keys_not_forwarded"] == ["f.behavior"]
    assert sorted(call.metadata["not_forwarded"]) == ["generationConfig.responseLogprobs", "safetySettings"]
