"""No request field lost in translation (issue 32), for chat completions, Responses and Messages (Gemini's is
``tests/test_gemini_fields.py``): a property test (hypothesis) over the request fields each API documents (tools with
every optional key, tool_choice variants, response formats, sampling keys, and the fields with no chat knob). Each
field a request sets either reaches the upstream chat request (or its equivalent, named in ``EQUIVALENT``), or is
refused with a 400 that names it, or is listed in the translation's notes, which the service writes into the
recorded call's metadata (``not_forwarded``, ``tools_not_forwarded``, ``tool_keys_not_forwarded``,
``tool_choice_not_forwarded``). ``strict`` on a tool is the case issue 32 found lost."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import ProxyError
from proxy._protocols.anthropic_messages import Messages
from proxy._protocols.openai_chat import ChatCompletions
from proxy._protocols.openai_responses import Responses

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
name = st.text("abcdefgh_", min_size=1, max_size=6)
schema = st.fixed_dictionaries({"type": st.just("object")}, optional={"properties": st.dictionaries(
    name, st.fixed_dictionaries({"type": st.sampled_from(["string", "number"])}), max_size=2)})
sampling = {"temperature": st.floats(0, 2), "top_p": st.floats(0, 1)}


def _noted(tr, key: str) -> list:
    return tr.notes.get(key) or []


def _check(protocol, body: dict, fields: list[str], reached) -> None:
    try:
        protocol.validate(body)
        tr = protocol.translate(body, "vllm", "r1")
    except ProxyError as exc:  # refused: the 400 names a field the body set
        assert exc.status == 400, exc
        assert any(f.split(".")[0] in exc.message or f == exc.param for f in fields), (exc.message, fields)
        return
    up = tr.upstream
    assert up["return_token_ids"] is True and bool(up.get("stream")) is bool(body.get("stream"))
    for field in fields:
        assert field in _noted(tr, "not_forwarded") or reached(field, body, up, tr), (field, body, up, tr.notes)


# ---- chat completions: the body goes upstream as it is -------------------------------------------------------------
c_tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": name}, optional={"description": st.text(max_size=8), "parameters": schema, "strict": st.booleans()})})
chat_fields = {
    **sampling, "model": name, "max_tokens": st.integers(1, 4096), "max_completion_tokens": st.integers(1, 4096),
    "stop": st.one_of(name, st.lists(name, max_size=3)), "seed": st.integers(0, 2**31), "n": st.just(1),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2), "logit_bias": st.just({"42": 1}),
    "logprobs": st.booleans(), "top_logprobs": st.integers(0, 5), "stream": st.booleans(),
    "stream_options": st.just({"include_usage": True}), "tools": st.lists(c_tool, min_size=1, max_size=2),
    "tool_choice": st.sampled_from(["none", "auto", "required", {"type": "function", "function": {"name": "a"}}]),
    "parallel_tool_calls": st.booleans(), "reasoning_effort": st.sampled_from(["minimal", "low", "medium", "high"]),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "json_schema",
                                        "json_schema": {"name": "o", "schema": {"type": "object"}, "strict": True}}]),
    "user": name, "metadata": st.just({"k": "v"}), "store": st.booleans(), "service_tier": st.just("auto"),
    "prompt_cache_key": name, "safety_identifier": name, "verbosity": st.sampled_from(["low", "high"]),
    "modalities": st.just(["text"]), "prediction": st.just({"type": "content", "content": "x"}),
    "chat_template_kwargs": st.just({"enable_thinking": False}), "top_k": st.integers(1, 50),
}
chat_bodies = st.fixed_dictionaries({"messages": st.just([{"role": "user", "content": "hi"}])}, optional=chat_fields)


def _chat_reached(field: str, body: dict, up: dict, tr) -> bool:
    if field == "logprobs":   # asked of the engine always; the client gets them only if it asked (``Wants``)
        return up["logprobs"] is True and tr.wants.logprobs == body["logprobs"]
    if field == "stream_options":
        return up[field].items() >= body[field].items()
    return up[field] == body[field]


@pytest.mark.parametrize("protocol", [ChatCompletions()], ids=["chat"])
def test_chat_completions_forwards_every_field(protocol):
    @SETTINGS
    @given(body=chat_bodies)
    def check(body):
        _check(protocol, body, [k for k in body if k != "messages"], _chat_reached)

    check()


# ---- Responses -----------------------------------------------------------------------------------------------------
r_function = st.fixed_dictionaries({"type": st.just("function"), "name": name}, optional={
    "description": st.text(max_size=8), "parameters": schema, "strict": st.booleans(), "defer_loading": st.booleans()})
r_custom = st.fixed_dictionaries({"type": st.just("custom"), "name": name}, optional={
    "description": st.text(max_size=8), "format": st.just({"type": "grammar", "syntax": "lark", "definition": "x"})})
r_hosted = st.sampled_from([{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["v"]},
                            {"type": "code_interpreter", "container": {"type": "auto"}}, {"type": "image_generation"}])
r_tools = st.lists(st.one_of(r_function, r_custom, r_hosted), min_size=1, max_size=3,
                   unique_by=lambda t: t.get("name") or t["type"])
responses_fields = {
    **sampling, "model": name, "instructions": st.text(min_size=1, max_size=8), "tools": r_tools,
    "tool_choice": st.sampled_from(["none", "auto", "required", {"type": "function", "name": "a"},
                                    {"type": "allowed_tools", "mode": "required", "tools": []},
                                    {"type": "web_search"}]),
    "parallel_tool_calls": st.booleans(), "max_output_tokens": st.integers(1, 4096), "top_logprobs": st.integers(0, 5),
    "reasoning": st.fixed_dictionaries({}, optional={
        "effort": st.sampled_from(["none", "minimal", "low", "medium", "high", "xhigh"]),
        "summary": st.sampled_from(["auto", "concise", "detailed"])}),
    "text": st.fixed_dictionaries({}, optional={
        "format": st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "json_schema", "name": "o",
                                   "schema": {"type": "object"}, "strict": True, "description": "d"}]),
        "verbosity": st.sampled_from(["low", "medium", "high"])}),
    "stream": st.booleans(), "stream_options": st.just({"include_obfuscation": False}), "store": st.booleans(),
    "include": st.lists(st.sampled_from(["reasoning.encrypted_content", "message.output_text.logprobs",
                                         "web_search_call.action.sources"]), max_size=2, unique=True),
    "prompt_cache_key": name, "prompt_cache_retention": st.just("24h"), "client_metadata": st.just({"k": "v"}),
    "metadata": st.just({"k": "v"}), "user": name, "safety_identifier": name, "service_tier": st.just("flex"),
    "truncation": st.sampled_from(["auto", "disabled"]), "background": st.booleans(), "max_tool_calls": st.integers(1, 9),
    "conversation": st.just("conv_1"), "prompt": st.just({"id": "pmpt_1"}),
    "context_management": st.just([{"type": "compaction", "compact_threshold": 1000}]),
}
responses_bodies = st.fixed_dictionaries({"input": st.just("hi")}, optional=responses_fields)
EQUIVALENT = {"prompt_cache_key", "prompt_cache_retention"}  # cache hints: the engine's prefix cache, rollout affinity


def _responses_fields(body: dict) -> list[str]:
    out = [k for k in body if k not in ("input", "reasoning", "text")]
    out += [f"reasoning.{k}" for k in body.get("reasoning", {})] + [f"text.{k}" for k in body.get("text", {})]
    return out


def _r_tools_reached(tools: list, up: dict, tr) -> bool:
    sent = {t["function"]["name"]: t["function"] for t in up.get("tools", [])}
    for t in tools:
        if t["type"] not in ("function", "custom"):
            assert t["type"] in _noted(tr, "tools_not_forwarded"), (t, tr.notes)
            continue
        fn = sent[t["name"]]
        assert fn.get("description") == (t.get("description") or None)
        if t["type"] == "function":
            assert fn["parameters"] == (t.get("parameters") or {"type": "object", "properties": {}})
            assert fn.get("strict") == t.get("strict")
        else:
            assert fn["parameters"]["required"] == ["input"]
            if "format" in t:
                assert t["format"]["definition"] in fn["parameters"]["properties"]["input"]["description"]
        for key in t.keys() - {"type", "name", "description", "parameters", "strict", "format"}:
            assert f"{t['name']}.{key}" in _noted(tr, "tool_keys_not_forwarded"), (key, tr.notes)
    return True


def _responses_reached(field: str, body: dict, up: dict, tr) -> bool:
    text, tools_up = body.get("text", {}), up.get("tools")
    fmt = text.get("format", {})
    checks = {
        "model": lambda: up["model"] == body["model"],
        "instructions": lambda: up["messages"][0] == {"role": "system", "content": body["instructions"]},
        "tools": lambda: _r_tools_reached(body["tools"], up, tr),
        "tool_choice": lambda: bool(tools_up) and (up["tool_choice"] == body["tool_choice"] if isinstance(
            body["tool_choice"], str) else up["tool_choice"] == {"type": "function", "function": {"name": "a"}}
            if body["tool_choice"]["type"] == "function" else up["tool_choice"] == "required"
            if body["tool_choice"]["type"] == "allowed_tools" else "tool_choice_not_forwarded" in tr.notes),
        "parallel_tool_calls": lambda: up.get("parallel_tool_calls") == body["parallel_tool_calls"],
        "max_output_tokens": lambda: up["max_tokens"] == body["max_output_tokens"],
        "temperature": lambda: up["temperature"] == body["temperature"],
        "top_p": lambda: up["top_p"] == body["top_p"],
        "top_logprobs": lambda: up["top_logprobs"] == body["top_logprobs"],
        "reasoning.effort": lambda: up.get("reasoning_effort") == body["reasoning"]["effort"],
        "text.format": lambda: (fmt["type"] == "text" and "response_format" not in up) or (
            up["response_format"]["type"] == fmt["type"] and all(
                up["response_format"]["json_schema"][k] == fmt[k] for k in fmt if k != "type")),
        "stream": lambda: up["stream"] is body["stream"],
        "store": lambda: (tr.wants.memory is None) is (body["store"] is False),
        "include": lambda: tr.wants.sealed == ("reasoning.encrypted_content" in body["include"]) and all(
            f"include.{i}" in _noted(tr, "not_forwarded") for i in body["include"]
            if i != "reasoning.encrypted_content"),
    }
    return field in EQUIVALENT or (field in checks and checks[field]())


def test_responses_forwards_refuses_or_notes_every_field():
    @SETTINGS
    @given(body=responses_bodies)
    def check(body):
        _check(Responses(), body, _responses_fields(body), _responses_reached)

    check()


# ---- Messages ------------------------------------------------------------------------------------------------------
m_custom = st.fixed_dictionaries({"name": name, "input_schema": schema}, optional={
    "type": st.just("custom"), "description": st.text(max_size=8), "strict": st.booleans(),
    "cache_control": st.just({"type": "ephemeral"}), "input_examples": st.just([{"a": "x"}])})
m_hosted = st.sampled_from([{"type": "web_search_20250305", "name": "web_search"},
                            {"type": "bash_20250124", "name": "bash"},
                            {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}])
messages_fields = {
    **sampling, "model": name, "system": st.one_of(st.text(min_size=1, max_size=8), st.just(
        [{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}}])),
    "stop_sequences": st.lists(name, min_size=1, max_size=3), "stream": st.booleans(), "top_k": st.integers(1, 50),
    "tools": st.lists(st.one_of(m_custom, m_hosted), min_size=1, max_size=3, unique_by=lambda t: t["name"]),
    "tool_choice": st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "none"])},
                              optional={"disable_parallel_tool_use": st.booleans()}),
        st.fixed_dictionaries({"type": st.just("tool"), "name": st.just("a")},
                              optional={"disable_parallel_tool_use": st.booleans()})),
    "thinking": st.one_of(st.just({"type": "disabled"}), st.just({"type": "adaptive"}),
                          st.fixed_dictionaries({"type": st.just("enabled"), "budget_tokens": st.integers(1024, 9999)})),
    "output_config": st.fixed_dictionaries({}, optional={
        "effort": st.sampled_from(["low", "medium", "high", "max"]),
        "format": st.just({"type": "json_schema", "schema": {"type": "object"}})}),
    "output_format": st.just({"type": "json_schema", "schema": {"type": "object", "properties": {}}}),
    "metadata": st.just({"user_id": "u"}), "service_tier": st.just("auto"), "container": st.just("c_1"),
    "mcp_servers": st.just([{"type": "url", "url": "https://x", "name": "x"}]), "inference_geo": st.just("us"),
    "context_management": st.just({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}),
    "cache_control": st.just({"type": "ephemeral"}),
}
messages_bodies = st.fixed_dictionaries({"messages": st.just([{"role": "user", "content": "hi"}]),
                                         "max_tokens": st.integers(1, 4096)}, optional=messages_fields)


def _messages_fields(body: dict) -> list[str]:
    out = [k for k in body if k not in ("messages", "thinking", "output_config", "tool_choice")]
    for section in ("thinking", "output_config", "tool_choice"):
        out += [f"{section}.{k}" for k in body.get(section, {})]
    return out


def _m_tools_reached(tools: list, up: dict, tr) -> bool:
    sent = {t["function"]["name"]: t["function"] for t in up.get("tools", [])}
    for t in tools:
        if "input_schema" not in t:
            assert t["type"] in _noted(tr, "tools_not_forwarded"), (t, tr.notes)
            continue
        fn = sent[t["name"]]
        assert fn["parameters"] == t["input_schema"] and fn.get("description") == (t.get("description") or None)
        assert fn.get("strict") == t.get("strict")
        for key in t.keys() - {"name", "description", "input_schema", "type", "strict", "cache_control"}:
            assert f"{t['name']}.{key}" in _noted(tr, "tool_keys_not_forwarded"), (key, tr.notes)
    return True


def _messages_reached(field: str, body: dict, up: dict, tr) -> bool:
    choice, config = body.get("tool_choice", {}), body.get("output_config", {})
    schema_up = (up.get("response_format") or {}).get("json_schema", {}).get("schema")
    checks = {
        "model": lambda: up["model"] == body["model"],
        "max_tokens": lambda: up["max_tokens"] == body["max_tokens"],
        "stop_sequences": lambda: up["stop"] == body["stop_sequences"],
        "temperature": lambda: up["temperature"] == body["temperature"],
        "top_p": lambda: up["top_p"] == body["top_p"],
        "top_k": lambda: up["top_k"] == body["top_k"],
        "stream": lambda: up["stream"] is body["stream"],
        "system": lambda: up["messages"][0]["role"] == "system",
        "tools": lambda: _m_tools_reached(body["tools"], up, tr),
        "tool_choice.type": lambda: up.get("tool_choice") == {"auto": "auto", "any": "required", "none": "none"}.get(
            choice["type"], {"type": "function", "function": {"name": choice.get("name")}}),
        "tool_choice.name": lambda: up["tool_choice"]["function"]["name"] == choice["name"],
        "tool_choice.disable_parallel_tool_use": lambda: up.get("parallel_tool_calls", True) is not choice[
            "disable_parallel_tool_use"],
        "thinking.type": lambda: up["chat_template_kwargs"]["enable_thinking"] == (body["thinking"]["type"] == "enabled"),
        "output_config.effort": lambda: up.get("reasoning_effort") == config["effort"],
        "output_config.format": lambda: schema_up == config["format"]["schema"],
        "output_format": lambda: schema_up == body["output_format"]["schema"],
        "cache_control": lambda: True,   # a cache hint: the engine's prefix cache is its equivalent
    }
    return field in checks and checks[field]()


def test_messages_forwards_refuses_or_notes_every_field():
    @SETTINGS
    @given(body=messages_bodies)
    def check(body):
        fields = _messages_fields(body)
        tools = [t for t in body.get("tools", []) if "input_schema" in t]
        if body.get("tool_choice") and not tools:   # a choice among no tools: the whole of it is noted
            fields = [f for f in fields if not f.startswith("tool_choice.")] + ["tool_choice"]
        _check(Messages(), body, fields, _messages_reached)

    check()


def test_a_tool_choice_of_no_named_tool_is_refused_naming_it():
    with pytest.raises(ProxyError) as exc:
        Messages().validate({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                             "tool_choice": {"type": "tool"}})
    assert exc.value.status == 400 and "tool_choice" in exc.value.message and "'name'" in exc.value.message


def test_strict_reaches_the_upstream_from_every_api():
    """The case issue 32 found: a tool's ``strict: true`` reaches the chat tool (and so the stored tool schema)."""
    r = Responses().translate({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {
        "type": "object"}, "strict": True}]}, "vllm", "r1")
    m = Messages().translate({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"name": "f", "input_schema": {"type": "object"}, "strict": True}]}, "vllm", "r1")
    assert r.upstream["tools"][0]["function"]["strict"] is True and r.tools[0]["function"]["strict"] is True
    assert m.upstream["tools"][0]["function"]["strict"] is True and m.tools[0]["function"]["strict"] is True
