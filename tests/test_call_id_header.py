"""Every answer to a recorded call names the stored call in ``X-OpenForge-Call-Id`` (README): unary and streamed, on
each wire protocol, through the official SDKs over loopback, on the proxy's own server and on the ASGI path."""

from __future__ import annotations

import anthropic
import httpx
import openai
import orjson
import pytest

from forge_store import Settings
from proxy import build_proxy
from proxy.engines.scripted import HTTPError, Text
from tests.proxy_fixtures import ProxyHarness, ServeInThread

HEADER = "X-OpenForge-Call-Id"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(params=["front", "uvicorn"])
def px(request, up, tmp_path):
    proxy = build_proxy(up.url, settings=Settings(home=tmp_path / "home"),
                        store_url=f"sqlite:///{tmp_path / 'proxy.sqlite'}")
    serve = ServeInThread(proxy.app, server=request.param)
    harness = ProxyHarness(proxy, serve.start(), up, serve.server)
    yield harness
    serve.stop()
    proxy.store.close()


def _chat(client: openai.OpenAI, stream: bool):
    raw = client.chat.completions.with_raw_response.create(model="m", messages=USER, stream=stream)
    return raw.headers, list(raw.parse()) if stream else raw.parse()


def _completions(client: openai.OpenAI, stream: bool):
    raw = client.completions.with_raw_response.create(model="m", prompt="The sky is", max_tokens=8, stream=stream)
    return raw.headers, list(raw.parse()) if stream else raw.parse()


def _responses(client: openai.OpenAI, stream: bool):
    raw = client.responses.with_raw_response.create(model="m", input="hi", stream=stream)
    return raw.headers, list(raw.parse()) if stream else raw.parse()


def _messages(client: anthropic.Anthropic, stream: bool):
    raw = client.messages.with_raw_response.create(model="m", max_tokens=64, messages=USER, stream=stream)
    return raw.headers, list(raw.parse()) if stream else raw.parse()


def _gemini(client: tuple[str, str], stream: bool):
    url, token = client  # the path names the model and the method; the key comes in Google's header
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    r = httpx.post(f"{url}/v1beta/models/m:{method}", headers={"x-goog-api-key": token},
                   json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    assert r.status_code == 200, r.text
    return r.headers, [orjson.loads(e[6:]) for e in r.content.split(b"\r\n\r\n") if e] if stream else r.json()


SURFACES = {"chat.completions": _chat, "completions": _completions, "responses": _responses, "messages": _messages,
            "gemini": _gemini}


def _client(px, surface: str, token: str):
    if surface == "messages":
        return anthropic.Anthropic(base_url=px.url, api_key=token, max_retries=0)
    if surface == "gemini":
        return px.url, token
    return px.client(token)


@pytest.mark.parametrize("surface", SURFACES)
def test_each_answer_names_its_stored_call(px, surface):
    """Two unary answers and two streams: four distinct ids, each the id of a call the store returns, in order."""
    px.up.double.script.extend([Text("one"), Text("two"), Text("three"), Text("four")])
    client = _client(px, surface, px.register("r1"))
    ids = []
    for stream in (False, True, False, True):
        headers, answer = SURFACES[surface](client, stream)
        assert answer  # the whole answer arrived (a stream: all its events)
        ids.append(headers[HEADER])
    assert len(set(ids)) == 4
    calls = px.calls("r1")
    assert [c.id for c in calls] == ids
    for call_id, call in zip(ids, calls):
        stored = px.store.call(call_id)
        assert stored.id == call_id and stored.rollout_id == "r1" and stored.api_surface == surface
        assert stored.error_class is None
    assert [c.streamed for c in calls] == [False, True, False, True]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_a_recorded_upstream_error_names_its_call(px, stream):
    """The upstream's own error is recorded; the client's error answer names that call (OpenAI and Anthropic)."""
    px.up.double.script.extend([HTTPError(400, "bad prompt"), HTTPError(400, "bad prompt")])
    token = px.register("r1")
    with pytest.raises(openai.BadRequestError) as err:
        px.client(token).chat.completions.create(model="m", messages=USER, stream=stream)
    with pytest.raises(anthropic.BadRequestError) as err2:
        _client(px, "messages", token).messages.create(model="m", max_tokens=8, messages=USER, stream=stream)
    ids = [err.value.response.headers[HEADER], err2.value.response.headers[HEADER]]
    calls = px.calls("r1")
    assert [c.id for c in calls] == ids and [c.error_class for c in calls] == ["upstream_http_400"] * 2


def test_an_unreachable_upstream_is_recorded_and_named(px):
    """A call the upstream never answered (502) is recorded all the same, and the 502 names it."""
    token = px.register("r1")
    px.up.server.stop()
    with pytest.raises(openai.APIStatusError) as err:
        px.client(token).chat.completions.create(model="m", messages=USER)
    assert err.value.status_code == 502
    (call,) = px.calls("r1")
    assert err.value.response.headers[HEADER] == call.id and call.error_class


def test_an_answer_to_an_unrecorded_request_has_no_call_id(px):
    """A request refused before anything was recorded (no token, bad JSON) names no call."""
    with pytest.raises(openai.AuthenticationError) as err:
        px.client("not-a-token").chat.completions.create(model="m", messages=USER)
    assert HEADER not in err.value.response.headers
