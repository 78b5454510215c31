"""Bodies the proxy cannot forward and record exactly get a clear 400 in the route's own error shape before anything
goes upstream (too deep, integers past 64 bits, invalid UTF-8, lone surrogates, a top level that is not an object,
a data URL that holds no image); a token of any bytes gets a 401; an unauthenticated admin request gets a 401
before its body is looked at. Each case: the status and the shape, nothing upstream (the double counts requests),
nothing recorded."""

from __future__ import annotations

import itertools
import json

import httpx
import pytest

from proxy._protocols.body import MAX_DEPTH
from proxy.engines.scripted import ScriptedUpstream, UpstreamServer
from tests.proxy_fixtures import Up, make_proxy

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
BODIES = {
    CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    RESPONSES: {"model": "m", "input": "hi"},
    MESSAGES: {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "m", "prompt": "hi"},
}


_ids = itertools.count()


@pytest.fixture(scope="module")
def proxy(tokenizer, tmp_path_factory):
    """One proxy for the module (starting one per case would cost more than the cases)."""
    double = ScriptedUpstream(tokenizer=tokenizer)
    server = UpstreamServer(double)
    up = Up(double, server.start(), server)
    harness, serve = make_proxy(up, tmp_path_factory.mktemp("bad-input"))
    yield harness
    serve.stop()
    harness.store.close()
    server.stop()


@pytest.fixture
def px(proxy):
    """The module's proxy with its upstream's records cleared; ``px.rid``: a rollout of this case's own."""
    proxy.up.double.reset()
    proxy.rid = f"r{next(_ids)}"
    return proxy


def _post(px, path: str, content: bytes, headers: dict | None = None) -> httpx.Response:
    return httpx.post(px.url + path, content=content, timeout=30,
                      headers={"content-type": "application/json", **(headers or {})})


def _call(px, path: str, content: bytes, token: str) -> httpx.Response:
    return _post(px, path, content, {"Authorization": f"Bearer {token}"})


def _error(r: httpx.Response, path: str, status: int, code: str | None = None) -> str:
    """The error's message, after checking its status and the route's API shape (and the code, OpenAI's)."""
    assert r.status_code == status, (r.status_code, r.text[:400])
    body = r.json()
    if path.startswith(MESSAGES):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body) == {"error"} and {"message", "type", "param", "code"} == set(body["error"]), body
        if code is not None:
            assert body["error"]["code"] == code, body
    return body["error"]["message"]


def _nothing_happened(px) -> None:
    assert px.up.double.requests == []  # nothing went upstream
    assert px.calls(px.rid) == []  # nothing recorded


def _nested(depth: int) -> bytes:
    """JSON ``depth`` objects and arrays deep."""
    return b'{"k": [' * (depth // 2) + (b"{}" if depth % 2 else b"1") + b"]}" * (depth // 2)


def _with(path: str, extra: bytes) -> bytes:
    """The path's minimal body with the JSON ``extra`` as a field of that name."""
    return json.dumps({**BODIES[path], "extra": 0}).encode().replace(b'"extra": 0', b'"extra": ' + extra)


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES])
@pytest.mark.parametrize("depth", [MAX_DEPTH, 255, 1023])  # the field sits one level under the body: MAX_DEPTH + 1
def test_too_deep_is_400_before_upstream(px, path, depth):
    token = px.register(px.rid)
    message = _error(_call(px, path, _with(path, _nested(depth)), token), path, 400, "too_deep")
    assert f"more than {MAX_DEPTH} levels" in message
    _nothing_happened(px)


@pytest.mark.parametrize("path", [RESPONSES, MESSAGES])
def test_past_orjsons_own_limit_is_invalid_json(px, path):
    token = px.register(px.rid)
    message = _error(_call(px, path, _with(path, _nested(1100)), token), path, 400, "invalid_json")
    assert "depth limit" in message
    _nothing_happened(px)


def test_deep_within_the_limit_goes_upstream_and_is_recorded_exactly(px):
    token = px.register(px.rid)
    deep = json.loads(_nested(MAX_DEPTH - 1))
    r = _call(px, CHAT, _with(CHAT, _nested(MAX_DEPTH - 1)), token)
    assert r.status_code == 200, r.text
    assert px.up.double.requests[-1].json["extra"] == deep
    assert px.calls(px.rid)[0].params["extra"] == deep


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES, "/v1/completions"])
@pytest.mark.parametrize("literal", [b"18446744073709551616", b"-9223372036854775809", b"1" + b"0" * 40, b"1e19"])
def test_integers_past_64_bits_are_400(px, path, literal):
    token = px.register(px.rid)
    raw = json.dumps({**BODIES[path], "seed": 0}).encode().replace(b'"seed": 0', b'"seed": ' + literal)
    message = _error(_call(px, path, raw, token), path, 400, "integer_out_of_range")
    assert "at seed" in message and "-2^63..2^64-1" in message
    _nothing_happened(px)


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES])
def test_64_bit_integers_are_forwarded_and_recorded_exactly(px, path):
    token = px.register(px.rid)
    ints = [2**64 - 1, -(2**63), 2**63, 12345678901234567890]
    raw = _with(path, json.dumps(ints).encode())
    assert _call(px, path, raw, token).status_code == 200
    assert px.up.double.requests[-1].json["extra"] == ints  # chat-completions upstream: unknown fields go on
    assert px.calls(px.rid)[0].params["extra"] == ints


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES])
@pytest.mark.parametrize("raw, fragment", [
    (b'{"model": "m\xff", "input": "hi", "messages": []}', "UTF-8"),
    (b'{"model": "m", "x": "\\ud800", "input": "hi", "messages": []}', "surrogate"),
    (b'{"model": "m", "x": "\xed\xa0\x80", "input": "hi", "messages": []}', "UTF-8"),  # a surrogate, UTF-8 encoded
    (b"[]", "not an object"), (b'"text"', "not an object"), (b"7", "not an object"), (b"null", "not an object"),
    (b'{"model": "m", "temperature": NaN}', "not valid JSON"), (b'{"model": "m", "temperature": 1e400}', "infinity"),
])
def test_unreadable_bodies_are_400(px, path, raw, fragment):
    token = px.register(px.rid)
    message = _error(_call(px, path, raw, token), path, 400, "invalid_json")
    assert fragment in message, message
    _nothing_happened(px)


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES, "/v1/completions", "/v1/messages/count_tokens"])
@pytest.mark.parametrize("headers", [{"Authorization": b"Bearer ofr1.\xff.0.x"}, {"Authorization": b"Bearer \xff"},
                                     {"x-api-key": b"\xff\xfe"}, {"x-api-key": "ofr1.é.0.sig".encode()}])
def test_tokens_of_any_bytes_are_401(px, path, headers):
    px.register(px.rid)
    message = _error(_post(px, path, json.dumps(BODIES.get(path, BODIES[MESSAGES])).encode(), headers), path, 401)
    assert "ASCII" in message
    _nothing_happened(px)


def test_token_bytes_on_the_other_routes_are_401(px):
    for path in ("/r/%FF/v1/responses", "/r/%C3%A9/v1/chat/completions"):
        assert _post(px, path, json.dumps(BODIES[RESPONSES]).encode()).status_code == 401
    assert httpx.get(px.url + "/v1/models", headers={"x-api-key": b"\xff"}).status_code == 401
    assert httpx.get(px.url + "/r/%FF/v1/models").status_code == 401
    for headers in ({"Authorization": b"Bearer \xff"}, {"Authorization": b"Bearer " + px.proxy.admin_token.encode()
                                                        + b"\xff"}):
        r = httpx.get(px.url + "/admin/status", headers=headers)
        _error(r, "/admin/status", 401, "invalid_admin_token")
    assert px.up.double.requests == []


@pytest.mark.parametrize("raw", [b'{"rollout_id": 5, "attempt": "x", "bogus": 1}', b"{not json", b"[1]",
                                 _nested(300), b'{"rollout_id": "\xff"}', b""])
def test_admin_authenticates_before_it_reads_the_body(px, raw):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": b"Bearer \xff"}):
        r = _post(px, "/admin/rollouts", raw, headers)
        message = _error(r, "/admin/rollouts", 401, "invalid_admin_token")
        assert "rollout_id" not in r.text and "attempt" not in message


@pytest.mark.parametrize("raw, code, fragment", [
    (b'{"rollout_id": 5, "attempt": 0}', "invalid_admin_request", "attempt"),
    (b'{"attempt": 4294967296}', "invalid_admin_request", "attempt"),
    (b'{"rollout_id": "a", "bogus": 1}', "invalid_admin_request", "bogus"),
    (b"{not json", "invalid_json", "not valid JSON"),
    (b'{"rollout_id": "a\\udc00"}', "invalid_json", "surrogate"),
    (b'{"rollout_id": "\xff"}', "invalid_json", "UTF-8"),
    (b'{"metadata": {"n": 18446744073709551616}}', "integer_out_of_range", "metadata.n"),
    (b'{"metadata": ' + _nested(300) + b"}", "too_deep", "levels deep"),
    (b"[1]", "invalid_json", "not an object"),
])
def test_admin_bodies_the_proxy_cannot_keep_are_400(px, raw, code, fragment):
    r = _post(px, "/admin/rollouts", raw, {"Authorization": f"Bearer {px.proxy.admin_token}"})
    message = _error(r, "/admin/rollouts", 400, code)
    assert fragment in message, message


PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


@pytest.mark.parametrize("path, body, media_type", [
    (RESPONSES, {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:text/plain;base64,aGVsbG8="}]}]}, "'text/plain'"),
    (RESPONSES, {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:;base64,aGVsbG8="}]}]}, "text/plain, RFC 2397"),
    (MESSAGES, {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "text/plain", "data": "aGVsbG8="}}]}]},
     "'text/plain'"),
    (MESSAGES, {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "data:application/pdf;base64,JVBERi0="}}]}]},
     "'application/pdf'"),
    (CHAT, {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:text/html;base64,PGI+"}}]}]}, "'text/html'"),
])
def test_data_urls_that_hold_no_image_are_400(px, path, body, media_type):
    token = px.register(px.rid)
    message = _error(_call(px, path, json.dumps(body).encode(), token), path, 400, "unsupported_media_type")
    assert media_type in message and "not an image" in message
    _nothing_happened(px)


def test_image_data_url_that_is_not_base64_is_400(px):
    token = px.register(px.rid)
    body = {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png,rawbytes"}]}]}
    _error(_call(px, RESPONSES, json.dumps(body).encode(), token), RESPONSES, 400, "invalid_image")
    _nothing_happened(px)


def test_a_real_image_data_url_still_goes_to_blobs(px):
    token = px.register(px.rid)
    body = {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}]}]}
    assert _call(px, RESPONSES, json.dumps(body).encode(), token).status_code == 200
    assert len(px.calls(px.rid)[0].image_hashes or []) == 1
