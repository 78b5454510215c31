"""No Gemini request field lost in translation (issue 32), a property test (hypothesis): for any request made of the
fields the Gemini API documents (``GenerateContentRequest``, its ``generationConfig``, ``thinkingConfig``, tools and
``toolConfig``), each field sent either reaches the upstream chat request (or its equivalent: ``candidateCount`` 1
is one choice, ``text/plain`` the default), or is refused with a 400 that names it, or is listed in the translation's
notes, which the service writes into the recorded call's metadata (``not_forwarded``, ``tools_not_forwarded``,
``tool_keys_not_forwarded``: ``tests/test_proxy_gemini.py`` reads them back from the store)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import ProxyError
from proxy._protocols.gemini import Gemini
from proxy._protocols.gemini.params import json_schema

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
CONTENTS = [{"role": "user", "parts": [{"text": "hi"}]}]
SAMPLING = {"temperature": "temperature", "topP": "top_p", "topK": "top_k", "maxOutputTokens": "max_tokens",
            "stopSequences": "stop", "seed": "seed", "presencePenalty": "presence_penalty",
            "frequencyPenalty": "frequency_penalty"}
NO_KNOB = ("responseLogprobs", "logprobs", "enableEnhancedCivicAnswers", "speechConfig", "imageConfig",
           "mediaResolution")

name = st.text("abcdefgh_", min_size=1, max_size=6)
g_schema = st.fixed_dictionaries({"type": st.just("OBJECT")}, optional={"properties": st.dictionaries(
    name, st.fixed_dictionaries({"type": st.sampled_from(["STRING", "INTEGER", "BOOLEAN"])}), max_size=2)})
j_schema = st.fixed_dictionaries({"type": st.just("object")}, optional={"properties": st.dictionaries(
    name, st.fixed_dictionaries({"type": st.sampled_from(["string", "number"])}), max_size=2)})
generation = {
    "temperature": st.floats(0, 2), "topP": st.floats(0, 1), "topK": st.integers(1, 100),
    "maxOutputTokens": st.integers(1, 4096), "stopSequences": st.lists(name, min_size=1, max_size=3),
    "seed": st.integers(0, 2**31), "presencePenalty": st.floats(-2, 2), "frequencyPenalty": st.floats(-2, 2),
    "candidateCount": st.integers(1, 3),
    "responseMimeType": st.sampled_from(["text/plain", "application/json", "text/x.enum"]),
    "responseSchema": g_schema, "responseJsonSchema": j_schema,
    "responseModalities": st.lists(st.sampled_from(["TEXT", "IMAGE", "AUDIO"]), min_size=1, max_size=2),
    "responseLogprobs": st.booleans(), "logprobs": st.integers(1, 5), "enableEnhancedCivicAnswers": st.booleans(),
    "speechConfig": st.just({"voiceConfig": {"prebuiltVoiceConfig": {"voiceName": "Kore"}}}),
    "imageConfig": st.just({"aspectRatio": "16:9"}), "mediaResolution": st.just("MEDIA_RESOLUTION_LOW"),
    "thinkingConfig": st.fixed_dictionaries({}, optional={
        "thinkingBudget": st.sampled_from([-1, 0, 128]), "includeThoughts": st.booleans(),
        "thinkingLevel": st.sampled_from(["low", "medium", "high", "minimal"])}),
}
declaration = st.fixed_dictionaries({"name": name}, optional={
    "description": st.text(max_size=8), "parameters": g_schema, "parametersJsonSchema": j_schema,
    "response": g_schema, "responseJsonSchema": j_schema, "behavior": st.sampled_from(["BLOCKING", "NON_BLOCKING"])})
tool = st.one_of(st.fixed_dictionaries({"functionDeclarations": st.lists(declaration, min_size=1, max_size=2,
                                                                         unique_by=lambda d: d["name"])}),
                 st.sampled_from([{"googleSearch": {}}, {"codeExecution": {}}, {"urlContext": {}}]))
fcc = st.fixed_dictionaries({}, optional={"mode": st.sampled_from(["AUTO", "ANY", "NONE", "VALIDATED"]),
                                          "allowedFunctionNames": st.lists(name, min_size=1, max_size=2)})
top = {
    "systemInstruction": st.one_of(st.text(min_size=1, max_size=8), st.just({"parts": [{"text": "Be terse."}]})),
    "tools": st.lists(tool, min_size=1, max_size=2),
    "toolConfig": st.fixed_dictionaries({}, optional={"functionCallingConfig": fcc,
                                                      "retrievalConfig": st.just({"languageCode": "en"})}),
    "safetySettings": st.just([{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}]),
    "cachedContent": st.just("cachedContents/abc"), "labels": st.just({"team": "a"}), "serviceTier": st.just("flex"),
    "generationConfig": st.fixed_dictionaries({}, optional=generation),
}
bodies = st.fixed_dictionaries({"contents": st.just(CONTENTS)}, optional=top)


def _fields(body: dict) -> list[str]:
    """Every field path the body sets, as a 400 or a note would name it."""
    out = [k for k in body if k not in ("contents", "generationConfig", "toolConfig")]
    out += [f"generationConfig.{k}" for k in body.get("generationConfig", {}) if k != "thinkingConfig"]
    out += [f"generationConfig.thinkingConfig.{k}" for k in body.get("generationConfig", {}).get("thinkingConfig", {})]
    if "toolConfig" in body:  # its fields; without a function to call, the whole of it
        tc = body["toolConfig"]
        if any(t.get("functionDeclarations") for t in body.get("tools", [])):
            out += [f"toolConfig.{k}" for k in tc if k != "functionCallingConfig"]
            out += [f"toolConfig.functionCallingConfig.{k}" for k in tc.get("functionCallingConfig", {})]
        else:
            out.append("toolConfig")
    return out


def _reached(field: str, body: dict, up: dict, tr) -> bool:
    """Whether ``field`` of ``body`` reached the upstream request ``up`` (or its equivalent)."""
    gen, section, _, key = body.get("generationConfig", {}), *field.rpartition(".")
    if section == "generationConfig" and key in SAMPLING:
        return up.get(SAMPLING[key]) == gen[key]
    fmt = (up.get("response_format") or {}).get("json_schema", {}).get("schema")
    checks = {
        "generationConfig.candidateCount": lambda: gen["candidateCount"] == 1 and up.get("n", 1) == 1,
        "generationConfig.responseMimeType": lambda: gen["responseMimeType"] == "text/plain" or "response_format" in up,
        "generationConfig.responseSchema": lambda: fmt == json_schema(gen["responseSchema"]),
        "generationConfig.responseJsonSchema": lambda: fmt == gen["responseJsonSchema"],
        "generationConfig.responseModalities": lambda: set(gen["responseModalities"]) == {"TEXT"},
        "generationConfig.thinkingConfig.thinkingBudget": lambda: up["chat_template_kwargs"]["enable_thinking"] == (
            gen["thinkingConfig"]["thinkingBudget"] != 0),
        "generationConfig.thinkingConfig.includeThoughts": lambda: tr.wants.thoughts == gen["thinkingConfig"][
            "includeThoughts"],
        "generationConfig.thinkingConfig.thinkingLevel": lambda: up.get("reasoning_effort") == gen["thinkingConfig"][
            "thinkingLevel"],
        "systemInstruction": lambda: tr.messages[0]["role"] == "system" and up["messages"][0] == tr.messages[0],
        "tools": lambda: _tools_reached(body["tools"], up, tr.notes),
        "toolConfig.functionCallingConfig.mode": lambda: up.get("tool_choice") is not None,
        "toolConfig.functionCallingConfig.allowedFunctionNames": lambda: isinstance(up.get("tool_choice"), dict),
    }
    return field in checks and checks[field]()


def _tools_reached(tools: list, up: dict, notes: dict) -> bool:
    """Each declaration upstream with its description and schema, every other key of it noted; hosted tools noted."""
    sent = {t["function"]["name"]: t["function"] for t in up.get("tools", [])}
    for t in tools:
        for key in t.keys() - {"functionDeclarations"}:
            assert key in notes["tools_not_forwarded"], (key, notes)
        for d in t.get("functionDeclarations", []):
            fn = sent[d["name"]]
            assert fn.get("description") == (d.get("description") or None)
            assert fn["parameters"] == d.get("parametersJsonSchema", json_schema(d.get("parameters"))) or (
                "parameters" not in d and "parametersJsonSchema" not in d)
            for key in d.keys() - {"name", "description", "parameters", "parametersJsonSchema"}:
                assert f"{d['name']}.{key}" in notes["tool_keys_not_forwarded"], (key, notes)
    return True


@pytest.mark.parametrize("stream", [False, True])
def test_each_documented_field_is_forwarded_refused_or_noted(stream):
    @SETTINGS
    @given(body=bodies)
    def check(body):
        protocol = Gemini("gemini-2.5-flash", stream)
        fields = _fields(body)
        try:
            protocol.validate(body)
            tr = protocol.translate(body, "vllm", "r1")
        except ProxyError as exc:  # refused: the 400 names a field the body set
            assert exc.status == 400, exc
            assert any(f in exc.message or f == exc.param for f in fields), (exc.message, fields)
            return
        up, noted = tr.upstream, tr.notes.get("not_forwarded", [])
        assert up["model"] == "gemini-2.5-flash" and up["stream"] is stream and up["return_token_ids"] is True
        for field in fields:
            assert field in noted or _reached(field, body, up, tr), (field, body, up, tr.notes)

    check()


@pytest.mark.parametrize("field, value", [("generationConfig", {"candidateCount": 2}),
                                          ("generationConfig", {"responseModalities": ["IMAGE"]}),
                                          ("cachedContent", "cachedContents/abc"),
                                          ("generationConfig", {"tempurature": 1})])
def test_refusals_name_the_field(field, value):
    with pytest.raises(ProxyError) as exc:
        Gemini("m").validate({"contents": CONTENTS, field: value})
    named = next(iter(value)) if isinstance(value, dict) else field
    assert exc.value.status == 400 and named in exc.value.message
