"""The recording proxy in front of a real vLLM on the CPU: what it stores is what the engine computed.

Checks the recorded prompt ids against vLLM's own ``/tokenize`` of the same messages, and the recorded completion
ids against the generated text (``/detokenize``), streaming and not, through the official openai SDK.
"""

from __future__ import annotations

import httpx
import pytest

from proxy.engines.vllm_cpu import MODEL_NAME
from tests.proxy_fixtures import Up, make_proxy

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three colours, comma separated."}]


@pytest.fixture
def vpx(vllm_server, tmp_path):
    root = vllm_server.removesuffix("/v1")
    px, serve = make_proxy(Up(double=None, url=root, server=None), tmp_path)
    yield px, root
    serve.stop()
    px.store.close()


def _tokenize(root: str, messages) -> list[int]:
    r = httpx.post(root + "/tokenize", json={"model": MODEL_NAME, "messages": messages, "add_generation_prompt": True},
                   timeout=120)
    r.raise_for_status()
    return r.json()["tokens"]


def _detokenize(root: str, ids) -> str:
    r = httpx.post(root + "/detokenize", json={"model": MODEL_NAME, "tokens": ids}, timeout=120)
    r.raise_for_status()
    return r.json()["prompt"]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_recorded_ids_are_the_engines(vpx, stream):
    px, root = vpx
    client = px.client(px.register("r1"), timeout=300)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=24, temperature=0, stream=True) if c.choices)
    else:
        r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=24, temperature=0)
        text = r.choices[0].message.content
        assert r.choices[0].logprobs is None and "prompt_token_ids" not in (r.model_extra or {})
    (call,) = px.calls("r1")
    assert call.token_exact and call.error_class is None
    assert call.prompt_token_ids == _tokenize(root, MESSAGES)
    decoded = _detokenize(root, call.completion_token_ids)
    assert decoded.replace("<|im_end|>", "") == text
    assert len(call.completion_logprobs) == len(call.completion_token_ids)
    assert call.response["text"] == text and call.usage["completion_tokens"] == len(call.completion_token_ids)


def test_second_turn_extends_the_first(vpx):
    px, root = vpx
    client = px.client(px.register("r2"), timeout=300)
    first = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=16, temperature=0)
    history = MESSAGES + [{"role": "assistant", "content": first.choices[0].message.content},
                          {"role": "user", "content": "Now one more."}]
    client.chat.completions.create(model=MODEL_NAME, messages=history, max_tokens=16, temperature=0)
    a, b = px.calls("r2")
    assert b.prompt_token_ids == _tokenize(root, history)
    # the engine's second prompt starts with the first prompt (the learner merges such turns)
    assert b.prompt_token_ids[: len(a.prompt_token_ids)] == a.prompt_token_ids


def test_a_gemini_harness_naming_its_own_model_is_served_counted_and_recorded_as_the_policy(vpx):
    """Gemini CLI names Gemini models; with a policy version active the real engine serves every call with the
    version's model (the only one it has), ``:countTokens`` counts with it (the chosen name is what vLLM's
    ``/tokenize`` reads as ``model``), and the call is stored as the served model under that version, the name the
    harness asked for kept beside it."""
    px, root = vpx
    r = px.admin("POST", "/admin/policy_versions", json={"id": "smollm2-v0", "model_name": MODEL_NAME,
                                                           "activate": True})
    assert r.status_code == 200 and r.json()["current"] == "smollm2-v0", r.text
    token, asked = px.register("gem"), "gemini-2.5-pro"
    contents = [{"role": "user", "parts": [{"text": m["content"]}]} for m in MESSAGES[1:]]
    body = {"systemInstruction": {"parts": [{"text": MESSAGES[0]["content"]}]}, "contents": contents}
    count = httpx.post(f"{px.url}/v1beta/models/{asked}:countTokens", headers={"x-goog-api-key": token},
                       json={"generateContentRequest": {"model": f"models/{asked}", **body}}, timeout=120)
    assert count.status_code == 200, count.text
    # vLLM's /tokenize of the same messages (with the generation prompt: what a call's prompt holds); a name vLLM
    # does not serve is a 404 there (its _check_model), so a count that kept the asked name would fail here
    ids = _tokenize(root, MESSAGES)
    assert count.json()["totalTokens"] == len(ids), (count.json(), len(ids))
    gen = httpx.post(f"{px.url}/v1beta/models/{asked}:generateContent", headers={"x-goog-api-key": token},
                     json={**body, "generationConfig": {"temperature": 0, "maxOutputTokens": 8}}, timeout=300)
    assert gen.status_code == 200, gen.text
    (call,) = px.calls("gem")
    assert call.model == MODEL_NAME and call.policy_version_id == "smollm2-v0"
    assert call.metadata["model_requested"] == asked
    assert call.token_exact and call.prompt_token_ids == ids
