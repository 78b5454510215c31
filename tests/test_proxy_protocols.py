"""The wire-protocol registry: routes, side routes and error shapes come from it; a new protocol is one class and one
entry; the proxy's request hash is the store's."""

from __future__ import annotations

import httpx
import pytest

from forge_store import json_sha256
from proxy import ProxyError
from proxy._protocols.contract import WireProtocol
from proxy._protocols.openai_chat import ChatCompletions
from proxy._protocols.registry import PROTOCOLS, SURFACES, Protocols, protocols
from proxy.engines.scripted import Text
from tests.proxy_fixtures import ProxyHarness, ServeInThread, make_proxy

USER = [{"role": "user", "content": "Say hello."}]
ANTHROPIC = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16, "model": "m"}


def test_every_registered_protocol_keeps_the_contract():
    assert SURFACES == ("chat.completions", "completions", "responses", "messages", "gemini")
    for surface, by_mode in PROTOCOLS.items():
        assert "translate" in by_mode
        for cls in by_mode.values():
            protocol = cls()
            assert isinstance(protocol, WireProtocol) and protocol.SURFACE == surface
            paths = protocol.PATHS + protocol.MODEL_PATHS
            assert paths and all(p.startswith(("/v1/", "/v1beta/")) for p in paths)
            assert protocol.UPSTREAM_PATH.startswith("/v1/")
            assert isinstance(protocol.error_body(ProxyError(400, "no")), dict)


def test_model_calls_are_routed_by_path_and_any_other_path_is_not_a_model_call():
    served = protocols()
    for path, surface in (("/v1/chat/completions", "chat.completions"), ("/v1/completions", "completions"),
                          ("/v1/responses", "responses"), ("/v1/messages", "messages")):
        protocol, api_path, token = served.route(path)
        assert (protocol.SURFACE, api_path, token) == (surface, path, None)
        protocol, api_path, token = served.route("/r/tok/" + path[1:])
        assert (protocol.SURFACE, api_path, token) == (surface, path, "tok")
    for path in ("/v1/unknown", "/v1/messages/count_tokens", "/r//v1/messages", "/r/tok", "/v1/models", "/health"):
        assert served.route(path) is None, path


def test_model_in_path_routes_bind_the_model_the_method_and_the_query():
    """The Gemini API names the model in the path and may carry its key in the query (issue 32)."""
    served = protocols()
    for path, query, model, stream, token in (
            ("/v1beta/models/gemini-2.5-flash:generateContent", b"", "gemini-2.5-flash", False, None),
            ("/v1/models/org/model:streamGenerateContent", b"alt=sse&key=k1", "org/model", True, "k1"),
            ("/r/tok/v1beta/models/m:generateContent", b"key=ignored", "m", False, "tok")):
        protocol, api_path, got = served.route(path, query)
        assert (protocol.SURFACE, protocol.model, protocol.stream, got) == ("gemini", model, stream, token)
        assert api_path == path.removeprefix("/r/tok")
    assert served.route("/v1beta/models/m:streamGenerateContent", b"alt=sse")[0].sse
    assert not served.route("/v1beta/models/m:streamGenerateContent")[0].sse  # Google's default: a JSON array
    for path in ("/v1beta/models/m:countTokens", "/v1beta/models/m:embedContent", "/v1beta/models/:generateContent",
                 "/v1beta/models/m", "/r//v1beta/models/m:generateContent"):
        assert served.route(path) is None, path
    one, two = (served.route("/v1beta/models/a:generateContent")[0] for _ in range(2))
    assert one is not two  # an instance per call


def test_each_path_answers_errors_in_its_protocols_shape():
    served, exc = protocols(), ProxyError(401, "no key", type="authentication_error")
    anthropic = {"type": "error", "error": {"type": "authentication_error", "message": "no key"}}
    for path in ("/v1/messages", "/r/t/v1/messages", "/v1/messages/count_tokens", "/r/t/v1/messages/count_tokens"):
        assert served.error_body(exc, path) == anthropic, path
    for path in ("/v1/chat/completions", "/r/t/v1/responses", "/v1/completions", "/v1/unknown", "/admin/status",
                 "/v1/models/gpt-4"):
        assert served.error_body(exc, path) == exc.openai_body(), path
    google = {"error": {"code": 401, "message": "no key", "status": "UNAUTHENTICATED"}}
    for path in ("/v1beta/models/m:generateContent", "/r/t/v1/models/m:countTokens", "/v1beta/models/m:embed"):
        assert served.error_body(exc, path) == google, path


def test_modes_and_paths_are_checked_when_the_proxy_is_built():
    assert type(protocols({"messages": "native"}).route("/v1/messages")[0]).__name__ == "NativeMessages"
    with pytest.raises(ValueError, match="responses mode 'bogus' unknown: use one of translate, native"):
        protocols({"responses": "bogus"})
    with pytest.raises(ValueError, match="no wire protocol is called 'grpc'"):
        protocols({"grpc": "translate"})
    with pytest.raises(ValueError, match="path /v1/chat/completions is claimed by ChatCompletions and ChatCompletions"):
        Protocols([ChatCompletions(), ChatCompletions()])


def test_errors_over_http_take_the_shape_of_the_api_called(px):
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        r = httpx.post(px.url + path, json={"model": "m"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = httpx.post(px.url + path, json=ANTHROPIC)
        assert r.status_code == 401 and r.json()["type"] == "error", path
        assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.post(px.url + "/v1/unknown", json={}).status_code == 404
    r = httpx.get(px.url + "/v1/responses")  # the websocket transport's side route, refused in OpenAI's shape
    assert r.status_code == 405 and r.json()["error"]["code"] == "websocket_not_supported"


class EchoChat(ChatCompletions):
    """A protocol the proxy does not ship: chat completions under another path and name, with its own error shape."""

    PATHS = ("/v2/echo/chat/completions",)
    SURFACE = "echo.chat"

    def error_body(self, exc: ProxyError) -> dict:
        return {"oops": exc.message, "status": exc.status}


def test_a_new_protocol_is_one_class_and_one_entry_and_its_surface_is_recorded(up, tmp_path):
    from proxy._operator_api import create_app

    base, serve = make_proxy(up, tmp_path)
    serve.stop()
    proxy = base.proxy
    proxy.app = create_app(proxy.service, Protocols([*protocols().served, EchoChat()]), admin_token=proxy.admin_token)
    serve = ServeInThread(proxy.app)
    px = ProxyHarness(proxy, serve.start(), up)
    try:
        up.double.script.extend([Text("Hello from elsewhere.")])
        token = px.register("r1")
        client = px.client(token)
        client.base_url = px.url + "/v2/echo"
        r = client.chat.completions.create(model="m", messages=USER)
        assert r.choices[0].message.content == "Hello from elsewhere."
        bad = httpx.post(px.url + "/v2/echo/chat/completions", content=b"{",
                         headers={"Authorization": f"Bearer {token}"})
        assert bad.status_code == 400 and bad.json()["oops"].startswith("request body is not valid JSON")
        (call,) = px.calls("r1")
        assert call.api_surface == "echo.chat" and call.token_exact and call.messages == USER
    finally:
        serve.stop()
        proxy.store.close()


def test_the_proxys_request_hash_is_the_stores_and_marks_retries(px):
    client = px.client(px.register("r1"))
    for temperature in (0.5, 0.5, 0.9):
        px.up.double.script.extend([Text("Hi.")])
        client.chat.completions.create(model="m", messages=USER, temperature=temperature)
    first, again, other = px.calls("r1")
    assert first.request_hash == again.request_hash != other.request_hash
    assert (first.retry_of, again.retry_of, other.retry_of) == (None, first.id, None)
    assert first.request_hash == json_sha256({"messages": first.message_hashes, "tools": first.tool_schema_hash,
                                              "params": first.params})
