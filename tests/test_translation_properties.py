"""Property tests of the Responses, Messages and Gemini translations (hypothesis): for any JSON body, inside the
schema or not, the request translation gives a request the proxy can forward and record, or the client's 4xx; for any
upstream chat answer or stream, the answer translation gives the client an answer, or an ``UpstreamFailure`` the
service records and answers as a 502. Never another exception: that would be a 500 (and, after the upstream
answered, a call left unrecorded)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy._errors import ProxyError, UpstreamFailure
from proxy._protocols.anthropic_messages import Messages
from proxy._protocols.gemini import Gemini
from proxy._protocols.openai_chat import ChatCompletions
from proxy._protocols.openai_responses import Responses

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
           | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
# what an upstream's answer can hold once orjson parsed it: no integer past 64 bits
answer_values = st.recursive(scalars.filter(lambda v: not isinstance(v, int) or -(2**63) <= v < 2**64),
                             lambda inner: st.lists(inner, max_size=4)
                             | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


def sometimes(good, junk=json_values):
    """Mostly values of the right shape, sometimes any JSON at all."""
    return st.one_of(good, good, good, junk)


def obj(required: dict, optional: dict | None = None, junk=json_values):
    return st.fixed_dictionaries({k: sometimes(v, junk) for k, v in required.items()},
                                 optional={k: sometimes(v, junk) for k, v in (optional or {}).items()})


def answer_obj(required: dict, optional: dict | None = None):
    return obj(required, optional, answer_values)


text = st.text(max_size=16)
data_url = st.sampled_from(["data:image/png;base64,iVBORw0KGgo=", "data:text/plain;base64,aGk=", "data:;base64,",
                            "data:image/png,raw", "https://example.com/a.png", "data:image/png;base64,@@"])

# ---- Responses -----------------------------------------------------------------------------------------------------
r_part = obj({"type": st.sampled_from(["input_text", "output_text", "input_image", "refusal", "input_file"])},
             {"text": text, "image_url": data_url, "detail": text, "refusal": text})
r_content = st.one_of(text, st.lists(r_part, max_size=3))
r_item = st.one_of(
    obj({"role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]), "content": r_content},
        {"type": st.just("message")}),
    obj({"type": st.just("reasoning")}, {"content": st.lists(obj({"text": text}), max_size=2),
                                          "encrypted_content": st.sampled_from(["ofr1:aGk=", "ofr1:%%", "x"])}),
    obj({"type": st.sampled_from(["function_call", "custom_tool_call"]), "call_id": text, "name": text},
        {"arguments": text, "input": text, "namespace": text}),
    obj({"type": st.sampled_from(["function_call_output", "custom_tool_call_output"]), "call_id": text},
        {"output": r_content}),
)
r_tool = st.one_of(
    obj({"type": st.sampled_from(["function", "custom", "web_search"]), "name": text},
        {"parameters": json_values, "description": text, "format": obj({}, {"definition": text, "syntax": text})}),
    obj({"type": st.just("namespace"), "name": text, "tools": st.lists(obj({"type": st.just("function"),
                                                                            "name": text}), max_size=2)}),
)
responses_bodies = obj({"model": text, "input": st.one_of(text, st.lists(r_item, max_size=4))}, {
    "instructions": st.one_of(text, st.lists(r_item, max_size=2)), "tools": st.lists(r_tool, max_size=3),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none"]), obj({"type": st.sampled_from(["function",
                                                                                               "allowed_tools"])},
                                                                     {"name": text, "mode": text})),
    "stream": st.booleans(), "store": st.booleans(), "include": st.lists(text, max_size=2),
    "reasoning": obj({}, {"effort": st.sampled_from(["low", "high", "max"])}),
    "text": obj({}, {"format": obj({"type": st.sampled_from(["json_schema", "json_object", "text"])},
                                   {"name": text, "schema": json_values})}),
    "max_output_tokens": st.integers(-5, 2**20), "temperature": st.floats(0, 2), "previous_response_id": text,
    "extra_knob": json_values})

# ---- Messages ------------------------------------------------------------------------------------------------------
source = st.one_of(obj({"type": st.just("base64"), "data": text},
                       {"media_type": st.sampled_from(["image/png", "text/plain", "image/webp"])}),
                   obj({"type": st.sampled_from(["url", "text", "file"]), "url": data_url, "data": text}))
m_block = st.one_of(
    obj({"type": st.sampled_from(["text", "thinking", "redacted_thinking", "audio"])},
        {"text": text, "thinking": text, "signature": text}),
    obj({"type": st.sampled_from(["image", "document"]), "source": source}),
    obj({"type": st.just("tool_use"), "id": text, "name": text}, {"input": json_values}),
    obj({"type": st.just("tool_result"), "tool_use_id": text},
        {"content": st.one_of(text, st.lists(obj({"type": st.just("text"), "text": text}), max_size=2)),
         "is_error": st.booleans()}),
)
m_message = obj({"role": st.sampled_from(["user", "assistant", "system", "tool"]),
                 "content": st.one_of(text, st.lists(m_block, max_size=3))})
messages_bodies = obj({"model": text, "max_tokens": st.integers(-1, 4096),
                       "messages": st.lists(m_message, max_size=4)}, {
    "system": st.one_of(text, st.lists(obj({"type": st.just("text"), "text": text}), max_size=2)),
    "tools": st.lists(obj({"name": text}, {"input_schema": json_values, "description": text, "type": text}),
                      max_size=3),
    "tool_choice": obj({"type": st.sampled_from(["auto", "any", "tool", "none"])},
                       {"name": text, "disable_parallel_tool_use": st.booleans()}),
    "thinking": obj({"type": st.sampled_from(["enabled", "disabled"])}, {"budget_tokens": st.integers(0, 99)}),
    "stop_sequences": st.lists(text, max_size=2), "stream": st.booleans(), "temperature": st.floats(0, 1),
    "output_config": obj({}, {"effort": text, "format": obj({"type": st.just("json_schema")},
                                                           {"schema": json_values})}),
    "extra_knob": json_values})

# ---- Gemini --------------------------------------------------------------------------------------------------------
g_part = st.one_of(
    obj({"text": text}, {"thought": st.booleans(), "thoughtSignature": text}),
    obj({"inlineData": obj({"mimeType": st.sampled_from(["image/png", "audio/wav", ""]), "data": text})}),
    obj({"fileData": obj({"mimeType": st.just("image/png"), "fileUri": data_url})}),
    obj({"functionCall": obj({"name": text}, {"args": json_values, "id": text})}),
    obj({"function_response": obj({"name": text}, {"response": json_values, "id": text})}),
    obj({"executableCode": json_values}))
g_content = obj({"parts": st.lists(g_part, max_size=3)}, {"role": st.sampled_from(["user", "model", "function", "x"])})
g_schema = obj({"type": st.sampled_from(["OBJECT", "STRING", "object"])},
               {"properties": st.dictionaries(text, obj({"type": st.sampled_from(["STRING", "INTEGER"])}),
                                              max_size=2)})
gemini_bodies = obj({"contents": st.lists(g_content, max_size=4)}, {
    "systemInstruction": st.one_of(text, obj({"parts": st.lists(obj({"text": text}), max_size=2)})),
    "tools": st.lists(st.one_of(obj({"functionDeclarations": st.lists(obj({"name": text}, {
        "description": text, "parameters": g_schema, "parametersJsonSchema": json_values, "behavior": text}),
        max_size=2)}), obj({"googleSearch": obj({})})), max_size=2),
    "toolConfig": obj({"functionCallingConfig": obj({}, {"mode": st.sampled_from(["AUTO", "ANY", "NONE", "x"]),
                                                         "allowedFunctionNames": st.lists(text, max_size=2)})}),
    "generation_config": obj({}, {
        "temperature": st.floats(0, 2), "topK": st.integers(0, 99), "maxOutputTokens": st.integers(-1, 9999),
        "stopSequences": st.lists(text, max_size=2), "candidateCount": st.integers(0, 3),
        "responseMimeType": st.sampled_from(["application/json", "text/plain", "text/x.enum"]),
        "responseSchema": g_schema, "responseModalities": st.lists(st.sampled_from(["TEXT", "IMAGE"]), max_size=2),
        "thinkingConfig": obj({}, {"thinkingBudget": st.integers(-1, 99), "includeThoughts": st.booleans(),
                                   "thinkingLevel": st.sampled_from(["low", "minimal"])})}),
    "safetySettings": st.lists(json_values, max_size=2), "cachedContent": text, "extra_knob": json_values})

PROTOCOLS = {"responses": (Responses, responses_bodies), "messages": (Messages, messages_bodies),
             "gemini": (Gemini, gemini_bodies)}


def _translate(protocol, body):
    """The translation, or None for the client's 4xx; anything else fails the test."""
    try:
        protocol.validate(body)
        return protocol.translate(body, "vllm", "r1")
    except ProxyError as exc:
        assert 400 <= exc.status < 500, exc
        protocol.error_body(exc)  # the error renders in the API's shape
        return None


@pytest.mark.parametrize("name", PROTOCOLS)
def test_request_translation_gives_a_request_or_a_4xx(name):
    cls, bodies = PROTOCOLS[name]

    @SETTINGS
    @given(body=st.one_of(bodies, bodies, bodies, st.dictionaries(text, json_values, max_size=5)))
    def check(body):
        tr = _translate(cls(), body)
        if tr is not None:  # what is kept and forwarded is JSON the proxy can write
            orjson.dumps(tr.upstream)
            orjson.dumps([tr.messages, tr.tools, tr.params, tr.notes])
            assert isinstance(tr.messages, list) and tr.messages

    check()


# ---- answers -------------------------------------------------------------------------------------------------------
tool_call = answer_obj({"id": text, "type": st.just("function"),
                        "function": answer_obj({"name": text, "arguments": st.one_of(text, st.just('{"a": 1}'))})},
                       {"index": st.integers(0, 3)})
message = answer_obj({"role": st.just("assistant")}, {"content": st.one_of(st.none(), text),
                                                      "reasoning_content": text,
                                                      "tool_calls": st.lists(tool_call, max_size=2)})
choice = answer_obj({"index": st.integers(0, 1),
                     "finish_reason": st.sampled_from(["stop", "length", "tool_calls", None])},
                    {"message": message, "stop_reason": text, "logprobs": answer_values,
                     "token_ids": st.lists(st.integers(0, 99), max_size=3)})
usage = answer_obj({}, {"prompt_tokens": st.integers(0, 99), "completion_tokens": st.integers(0, 99),
                        "total_tokens": st.integers(0, 99)})
answers = answer_obj({"id": text, "object": st.just("chat.completion"), "choices": st.lists(choice, max_size=2)},
                     {"usage": usage, "prompt_token_ids": st.lists(st.integers(0, 99), max_size=3)})
delta = answer_obj({}, {"content": text, "reasoning_content": text, "tool_calls": st.lists(tool_call, max_size=2)})
chunk_choice = answer_obj({"index": st.integers(0, 1)}, {"delta": delta, "stop_reason": text,
                                                         "finish_reason": st.sampled_from(["stop", "length"])})
chunk = st.one_of(answer_obj({"choices": st.lists(chunk_choice, max_size=2)},
                             {"usage": usage, "prompt_token_ids": st.lists(st.integers(0, 9), max_size=2)}),
                  answer_obj({"error": st.one_of(text, answer_obj({"message": text}))}))
events = st.lists(st.one_of(chunk.map(lambda c: b"data: " + orjson.dumps(c)), st.just(b": keep-alive"),
                            st.just(b"data: [DONE]")), max_size=6)

CHAT_REQUEST = {"model": "m", "input": "hi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                "stop_sequences": ["x"]}
GEMINI_REQUEST = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 5}}


def _asked(name: str, stream: bool):
    """(protocol, translation) of a small request through protocol ``name`` (the Gemini API's streaming is its
    path's, not its body's)."""
    if name == "gemini":
        protocol = Gemini("m", stream)
        return protocol, protocol.translate(GEMINI_REQUEST, "vllm", "r1")
    protocol = ChatCompletions() if name == "chat" else PROTOCOLS[name][0]()
    return protocol, protocol.translate({**CHAT_REQUEST, "stream": stream}, "vllm", "r1")


@pytest.mark.parametrize("name", [*PROTOCOLS, "chat"])
def test_answer_translation_gives_an_answer_or_a_502(name):
    @SETTINGS
    @given(data=st.one_of(answers, answers, answers, st.dictionaries(text, answer_values, max_size=4)))
    def check(data):
        protocol, tr = _asked(name, False)
        wants = tr.wants
        try:
            protocol.parse(data)
            orjson.dumps(protocol.answer(data, wants))
        except UpstreamFailure as exc:
            assert exc.status == 502 and exc.error_class == "upstream_protocol", exc

    check()


@pytest.mark.parametrize("name", [*PROTOCOLS, "chat"])
def test_stream_translation_gives_events_or_a_502(name):
    @SETTINGS
    @given(stream=events)
    def check(stream):
        protocol, tr = _asked(name, True)
        relay = protocol.relay(tr.wants)
        out = []
        try:
            for event in stream:
                out.append(relay.feed(event))
                if relay.done:
                    break
        except UpstreamFailure as exc:  # what the service does with it: recorded, the API's failure event sent
            assert exc.status == 502 and exc.error_class == "upstream_protocol", exc
            out.append(relay.failure(exc))
        relay.result()
        out.append(relay.end())
        assert all(isinstance(piece, bytes) for piece in out)

    check()


@pytest.mark.parametrize("name", [*PROTOCOLS, "chat"])
@pytest.mark.parametrize("bad", [{"delta": {"content": ["x"]}}, {"delta": {"reasoning_content": True}},
                                 {"delta": {}, "finish_reason": ["stop"]}])
def test_a_chunk_whose_text_is_not_text_is_the_upstreams_502(name, bad):
    """Found by the stream property above: such a chunk used to pass ``feed`` and break ``result`` / ``end`` (a 500,
    the call unrecorded); now ``feed`` refuses it, and the relay still gives a result and an end."""
    protocol, tr = _asked(name, True)
    relay = protocol.relay(tr.wants)
    with pytest.raises(UpstreamFailure) as exc:
        relay.feed(b"data: " + orjson.dumps({"choices": [{"index": 0, **bad}]}))
    assert exc.value.status == 502 and exc.value.error_class == "upstream_protocol"
    relay.failure(exc.value)
    relay.result()
    assert isinstance(relay.end(), bytes)
