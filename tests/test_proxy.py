"""The recording proxy over real loopback HTTP, driven by the official openai SDK, against the scripted upstream."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest
import sqlalchemy as sa

from proxy.engines.scripted import Delay, Text, ToolCall, ToolCalls

USER = [{"role": "user", "content": "Say hello to the team."}]


def _tokenize(px, messages, tools=None) -> list[int]:
    body = {"messages": messages, **({"tools": tools} if tools else {})}
    return httpx.post(px.up.url + "/tokenize", json=body).json()["tokens"]


def test_chat_is_recorded_token_exact_and_extras_are_stripped(px, tokenizer):
    px.up.double.script.extend([Text("Hello, team!")])
    r = px.client(px.register("r1")).chat.completions.create(model="m", messages=USER, temperature=0.7)
    assert r.choices[0].message.content == "Hello, team!"
    assert r.choices[0].logprobs is None  # the harness did not ask: the proxy's logprobs are stripped
    assert "prompt_token_ids" not in (r.model_extra or {}) and "token_ids" not in (r.choices[0].model_extra or {})
    sent = px.up.double.requests[-1].json
    assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["temperature"] == 0.7
    (call,) = px.calls("r1")
    assert call.token_exact and call.api_surface == "chat.completions" and not call.streamed
    assert call.prompt_token_ids == _tokenize(px, USER)
    assert tokenizer.decode(call.completion_token_ids).startswith("Hello, team!")
    assert len(call.completion_logprobs) == len(call.completion_token_ids)
    assert all(lp <= 0 for lp in call.completion_logprobs)
    assert call.messages == USER and call.params["temperature"] == 0.7 and call.finish_reason == "stop"
    assert call.usage["prompt_tokens"] == len(call.prompt_token_ids)
    assert call.latency_ms > 0 and call.upstream_status == 200


def test_harness_that_asks_for_ids_and_logprobs_gets_them(px):
    r = px.client(px.register("r1")).chat.completions.create(
        model="m", messages=USER, logprobs=True, top_logprobs=2, extra_body={"return_token_ids": True})
    (call,) = px.calls("r1")
    assert r.model_extra["prompt_token_ids"] == call.prompt_token_ids
    assert r.choices[0].model_extra["token_ids"] == call.completion_token_ids
    assert [c.logprob for c in r.choices[0].logprobs.content] == pytest.approx(call.completion_logprobs, abs=1e-6)


def test_stream_is_relayed_and_assembled(px, tokenizer):
    px.up.double.script.extend([Text("One two three four five.")])
    client = px.client(px.register("r1"))
    chunks = list(client.chat.completions.create(model="m", messages=USER, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "One two three four five."
    assert all(c.usage is None for c in chunks)  # the usage chunk the proxy asked for is not forwarded
    assert all("token_ids" not in (c.choices[0].model_extra or {}) for c in chunks if c.choices)
    assert px.up.double.requests[-1].json["stream_options"] == {"include_usage": True}
    (call,) = px.calls("r1")
    assert call.streamed and call.token_exact and call.ttft_ms is not None and call.ttft_ms <= call.latency_ms
    assert call.prompt_token_ids == _tokenize(px, USER)
    assert tokenizer.decode(call.completion_token_ids).startswith(text)
    assert call.response["text"] == text and call.usage["completion_tokens"] == len(call.completion_token_ids)


def test_stream_with_usage_requested_keeps_the_usage_chunk(px):
    client = px.client(px.register("r1"))
    chunks = list(client.chat.completions.create(model="m", messages=USER, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls(px, stream):
    px.up.double.script.extend([ToolCalls([ToolCall("shell", {"cmd": "ls -la"})])])
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}}}}}]
    client = px.client(px.register("r1"))
    if stream:
        chunks = list(client.chat.completions.create(model="m", messages=USER, tools=tools, stream=True))
        args = "".join(tc.function.arguments or "" for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or [])
        assert '"cmd"' in args
    else:
        r = client.chat.completions.create(model="m", messages=USER, tools=tools)
        assert r.choices[0].message.tool_calls[0].function.name == "shell"
    (call,) = px.calls("r1")
    assert call.finish_reason == "tool_calls" and call.tools == tools and call.tool_schema_hash
    assert call.response["tool_calls"][0]["function"]["name"] == "shell"
    assert call.prompt_token_ids == _tokenize(px, USER, tools)


def test_async_client_many_rollouts_at_once(px):
    tokens = {f"r{i}": px.register(f"r{i}") for i in range(4)}

    async def one(rid, i, stream):
        client = px.async_client(tokens[rid])
        msgs = [{"role": "user", "content": f"question {i}"}]
        if stream:
            async for _ in await client.chat.completions.create(model="m", messages=msgs, stream=True):
                pass
        else:
            await client.chat.completions.create(model="m", messages=msgs)
        await client.close()

    async def main():
        await asyncio.gather(*(one(f"r{i % 4}", i, i % 2 == 0) for i in range(24)))

    asyncio.run(main())
    calls = [c for i in range(4) for c in px.calls(f"r{i}")]
    assert len(calls) == 24 and all(c.token_exact for c in calls)
    assert sum(c.streamed for c in calls) == 12


def test_multi_turn_conversation_is_stored_as_deltas(px):
    client = px.client(px.register("r1"))
    history = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count to three."}]
    for turn in range(4):
        r = client.chat.completions.create(model="m", messages=history)
        history = history + [{"role": "assistant", "content": r.choices[0].message.content},
                             {"role": "user", "content": f"Again, turn {turn}."}]
    calls = px.calls("r1")
    assert [len(c.messages) for c in calls] == [2, 4, 6, 8]
    for c, nxt in zip(calls, calls[1:]):  # each prompt extends the previous prompt + completion
        assert nxt.prompt_token_ids[: len(c.prompt_token_ids)] == c.prompt_token_ids
    with px.store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT prompt_base_len, prompt_ids_prefix_len FROM calls ORDER BY seq")).all()
    assert [r[0] for r in rows] == [0, 2, 4, 6] and all(r[1] > 0 for r in rows[1:])


def test_same_request_twice_is_a_retry_of_the_first(px):
    client = px.client(px.register("r1"))
    client.chat.completions.create(model="m", messages=USER)
    client.chat.completions.create(model="m", messages=USER)
    first, second = px.calls("r1")
    assert first.retry_of is None and second.retry_of == first.id and first.request_hash == second.request_hash


def test_images_go_to_blobs_and_upstream_gets_them_unaltered(px):
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is on the screen?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]
    px.client(px.register("r1")).chat.completions.create(model="m", messages=msgs)
    assert px.up.double.requests[-1].json["messages"] == msgs
    (call,) = px.calls("r1")
    assert call.image_hashes and px.store.get_blob(call.image_hashes[0]) == png
    assert base64.b64encode(png).decode() not in str(call.messages)


def test_sub_agents_of_one_rollout_at_once_each_store_their_own_prompt(px):
    """Concurrent calls of one rollout sharing a history (a screenshot, a secret) with different last messages: the
    rollout's one prompt cache serves them all, and every call stores its own whole prompt, redacted, its image as a
    blob, whichever call's copies it reused."""
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    shared = [{"role": "system", "content": "Key sk-" + "a" * 24 + " is secret."},
              {"role": "user", "content": [{"type": "text", "text": "The screen:"}, {"type": "image_url", "image_url": {
                  "url": "data:image/png;base64," + base64.b64encode(png).decode()}}]}]
    token = px.register("r1")

    async def one(i: int):
        client = px.async_client(token)
        await client.chat.completions.create(model="m", messages=shared + [{"role": "user", "content": f"task {i}"}])
        await client.close()

    async def main():
        await asyncio.gather(*(one(i) for i in range(12)))

    asyncio.run(main())
    calls = px.calls("r1")
    assert sorted(c.messages[-1]["content"] for c in calls) == sorted(f"task {i}" for i in range(12))
    assert all(c.messages[:2] == calls[0].messages[:2] for c in calls)
    assert calls[0].messages[0]["content"] == "Key [REDACTED:api_keys] is secret."
    assert all(c.metadata["redacted"] == ["api_keys"] and len(c.image_hashes) == 1 for c in calls)
    assert px.store.get_blob(calls[0].image_hashes[0]) == png


def test_completions_endpoint_with_text_and_token_prompts(px, tokenizer):
    client = px.client(px.register("r1"))
    r = client.completions.create(model="m", prompt="The capital of France is", max_tokens=8)
    ids = tokenizer.encode("Hello world")
    r2 = client.completions.create(model="m", prompt=ids, max_tokens=4)
    assert r.choices[0].text and r2.choices[0].text is not None
    c1, c2 = px.calls("r1")
    assert c1.api_surface == "completions" and c1.token_exact and c1.messages == [
        {"role": "prompt", "content": "The capital of France is"}]
    assert c2.prompt_token_ids == ids and c2.token_exact
    assert r.choices[0].logprobs is None and px.up.double.requests[0].json["logprobs"] == 0


def test_unknown_fields_are_forwarded_and_recorded(px):
    px.client(px.register("r1")).chat.completions.create(
        model="m", messages=USER, extra_body={"my_sampler_knob": {"a": 1}, "repetition_penalty": 1.1})
    assert px.up.double.requests[-1].json["my_sampler_knob"] == {"a": 1}
    (call,) = px.calls("r1")
    assert call.params["my_sampler_knob"] == {"a": 1} and call.params["repetition_penalty"] == 1.1


def test_credentials_are_never_stored_and_secrets_are_redacted(px, tmp_path):
    token = px.register("r1")
    secret = "sk-proj-" + "A1b2C3d4" * 5
    msgs = [{"role": "user", "content": f"my key is {secret}, keep it safe"}]
    px.client(token).chat.completions.create(model="m", messages=msgs)
    assert px.up.double.requests[-1].json["messages"] == msgs  # upstream sees what the harness sent
    (call,) = px.calls("r1")
    assert "[REDACTED:api_keys]" in call.messages[0]["content"] and call.metadata["redacted"] == ["api_keys"]
    dump = b""
    with px.store.engine.connect() as conn:
        for table in ("calls", "messages", "events", "rollouts"):
            dump += str(conn.execute(sa.text(f"SELECT * FROM {table}")).all()).encode()
    for f in (tmp_path / "proxy-home").rglob("*"):
        if f.is_file() and f.name not in ("proxy-secret", "proxy-admin-token"):
            dump += f.read_bytes()
    assert token.encode() not in dump
    assert secret.encode() not in dump  # the scripted answer echoes the prompt: answers are redacted too
    assert call.response["text"] is None or secret not in call.response["text"]


def test_policy_versions_are_recorded_and_switched(px):
    assert px.admin("POST", "/admin/policy_versions", json={"id": "p1", "model_name": "smollm2"}).status_code == 200
    client = px.client(px.register("r1"))
    client.chat.completions.create(model="m", messages=USER)
    px.admin("POST", "/admin/policy_versions", json={"id": "p2", "model_name": "smollm2", "global_step": 10})
    client.chat.completions.create(model="m", messages=USER + [{"role": "user", "content": "more"}])
    assert [c.policy_version_id for c in px.calls("r1")] == ["p1", "p2"]
    assert px.store.rollout("r1").policy_version_id == "p1"


def test_pause_holds_new_calls_until_resume(px):
    px.up.double.script.extend([Delay(0.5)])
    client = px.async_client(px.register("r1"))

    async def main():
        slow = asyncio.create_task(client.chat.completions.create(model="m", messages=USER))
        await asyncio.sleep(0.2)
        paused = await asyncio.to_thread(px.admin, "POST", "/admin/pause", json={"drain": True, "timeout_s": 10})
        assert paused.json() == {"paused": True, "was_paused": False, "drained": True, "in_flight": 0,
                                 "in_flight_at_pause": 1, "policy_version": None}  # the drain waited for the call
        await asyncio.wait_for(slow, 5)
        held = asyncio.create_task(client.chat.completions.create(model="m", messages=USER))
        await asyncio.sleep(0.3)
        assert not held.done()
        await asyncio.to_thread(px.admin, "POST", "/admin/resume")
        await asyncio.wait_for(held, 10)

    asyncio.run(main())
    assert len(px.calls("r1")) == 2


def test_path_token_and_x_api_key_and_models(px):
    token = px.register("r1")
    r = httpx.post(f"{px.url}/r/{token}/v1/chat/completions", json={"model": "m", "messages": USER})
    assert r.status_code == 200
    r = httpx.post(f"{px.url}/v1/chat/completions", json={"model": "m", "messages": USER}, headers={"x-api-key": token})
    assert r.status_code == 200
    models = px.client(token).models.list()
    assert models.data and httpx.get(f"{px.url}/r/{token}/v1/models").status_code == 200
    assert len(px.calls("r1")) == 2


def test_health_and_metrics(px):
    px.up.double.script.extend([Delay(0.3, then=Text("slow"))])
    px.client(px.register("r1")).chat.completions.create(model="m", messages=USER)
    assert httpx.get(px.url + "/health").json()["status"] == "ok"
    text = httpx.get(px.url + "/metrics").text
    assert 'openforge_proxy_calls_total{outcome="ok",surface="chat.completions",token_exact="true"} 1.0' in text
    assert "openforge_proxy_journal_seconds_bucket" in text
    # the proxy's own time excludes the upstream's 0.3 s: one observation, under 0.1 s, though the call took 0.3
    assert "openforge_proxy_overhead_seconds_count 1.0" in text
    assert 'openforge_proxy_overhead_seconds_bucket{le="0.1"} 1.0' in text
    assert 'openforge_proxy_call_seconds_bucket{le="0.25",surface="chat.completions"} 0.0' in text


def test_a_lone_call_yields_the_cpu_once_its_request_is_upstream_and_one_among_others_does_not(px, monkeypatch):
    """With no other call in flight the proxy yields right after writing the request upstream (so that an inference
    server on the same CPU starts on it before the proxy's own bookkeeping); with others in flight it does not."""
    import proxy._service

    registry = px.proxy.app.service.rollouts
    seen: list[int] = []  # calls in flight at each yield
    monkeypatch.setattr(proxy._service, "_sched_yield", lambda: seen.append(registry.in_flight))
    client = px.async_client(px.register("r1"))

    async def main():
        await client.chat.completions.create(model="m", messages=USER)  # alone
        assert seen == [1]
        px.up.double.script.extend([Delay(0.5, then=Text("slow")), Text("fast")])
        slow = asyncio.ensure_future(client.chat.completions.create(model="m", messages=USER))
        while registry.in_flight == 0:
            await asyncio.sleep(0.01)
        await client.chat.completions.create(model="m", messages=USER + [{"role": "user", "content": "again"}])
        await slow

    asyncio.run(main())
    assert seen == [1, 1]  # the slow call yielded (it went alone); the one made beside it did not
    assert len(px.calls("r1")) == 3


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_answer_with_a_nul_character_is_stored_on_postgresql_and_the_rollout_goes_on(up, tmp_path, pg_database,
                                                                                       stream):
    """A model that emits U+0000 (a byte-level tokenizer can): PostgreSQL's jsonb refuses the character, and the
    call's record must land anyway, exactly, with the next call of the rollout readable after it."""
    from tests.proxy_fixtures import running_proxy

    up.double.script.extend([Text("zero \x00 byte"), Text("next")])
    with running_proxy(up, tmp_path, store_url=pg_database) as px:
        client = px.client(px.register("r1"))
        messages = list(USER)
        for _ in range(2):
            r = client.chat.completions.create(model="m", messages=messages, stream=stream)
            text = "".join(c.choices[0].delta.content or "" for c in r) if stream else r.choices[0].message.content
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
        first, second = px.calls("r1")
        assert px.store.writer_status()["dead_letters"] == 0
        assert first.response["text"] == first.response_message["content"] == messages[1]["content"] == "zero \x00 byte"
        assert second.messages == messages[:3] and second.response["text"] == "next"
        assert first.token_exact and second.token_exact


def test_logprobs_not_one_per_token_are_not_stored_and_the_call_says_so():
    """An engine that sends 2 logprobs for 3 tokens: the store cannot use them (none are stored) and the call's
    metadata records the counts, which the learner's export turns into a ``logprob_mismatch`` exclusion."""
    from proxy._protocols.completion import Completion
    from proxy._service import ProxyService
    from tests.conftest import make_call

    rec = make_call("c1", "r1", 0)
    ProxyService._fill(rec, Completion(text="hi", finish_reason="stop", prompt_token_ids=[1, 2],
                                       completion_token_ids=[5, 6, 7], logprobs=[-0.1, -0.2]))
    assert rec.completion_logprobs is None
    assert rec.metadata["logprob_mismatch"] == {"logprobs": 2, "completion_tokens": 3}
    ok = make_call("c2", "r1", 1)
    ProxyService._fill(ok, Completion(text="hi", finish_reason="stop", prompt_token_ids=[1, 2],
                                      completion_token_ids=[5, 6], logprobs=[-0.1, -0.2]))
    assert ok.completion_logprobs == [-0.1, -0.2] and "logprob_mismatch" not in (ok.metadata or {})
