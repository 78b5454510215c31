"""Bad input and faults at the proxy: each gets a clear, API-shaped error and loses nothing."""

from __future__ import annotations

import base64
import contextlib
import json
import os

import httpx
import openai
import pytest

from proxy.engines.scripted import Delay, HTTPError, Text
from tests.proxy_fixtures import make_proxy

USER = [{"role": "user", "content": "hello"}]


def _post(px, token, body: bytes | dict, path="/v1/chat/completions", **headers):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.post(px.url + path, headers={"Authorization": f"Bearer {token}", **headers}, timeout=30, **kw)


@pytest.mark.parametrize("body, fragment", [
    (b'{"model": "m", "messages": [', "not valid JSON"),
    (b"[1, 2]", "not an object"),
    (b'{"model": "m"}', "'messages' must be a list"),
    (b'{"model": "m", "messages": ["hi"]}', "'messages' must be a list"),
])
def test_malformed_requests_get_openai_shaped_400(px, body, fragment):
    r = _post(px, px.register("r1"), body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert fragment in err["message"] and err["type"] == "invalid_request_error"
    assert px.up.double.requests == []  # nothing was forwarded


def test_malformed_json_through_the_sdk_is_a_bad_request(px):
    client = px.client(px.register("r1"))
    with pytest.raises(openai.BadRequestError, match="'prompt' is required"):
        client.completions.create(model="m", prompt=openai.NOT_GIVEN)


def test_body_over_the_limit_is_413_naming_the_limit(up, tmp_path):
    px, serve = make_proxy(up, tmp_path, proxy_max_body_bytes=4096)
    try:
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 10_000}]}
        r = _post(px, px.register("r1"), big)
        assert r.status_code == 413 and "limit of 4,096 bytes" in r.json()["error"]["message"]
        # chunked upload without Content-Length is cut off too
        r = httpx.post(px.url + "/v1/chat/completions", content=iter([b'{"messages": "' + b"y" * 8000 + b'"}']),
                       headers={"Authorization": f"Bearer {px.register('r2')}"})
        assert r.status_code == 413
    finally:
        serve.stop()
        px.store.close()


def test_undecodable_image_is_400(px):
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!notb64"}}]}]
    r = _post(px, px.register("r1"), {"model": "m", "messages": msgs})
    assert r.status_code == 400 and "not valid base64" in r.json()["error"]["message"]
    assert px.up.double.requests == []


def test_an_image_spelled_with_json_escapes_is_still_checked_before_upstream(px):
    """An image part whose type is spelled only through JSON escapes (which decode to the same part) is checked
    before upstream all the same: the check reads the parsed body, never the raw bytes."""
    raw = (b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "\\u0069mage_url", '
           b'"\\u0069mage_url": {"url": "data:\\u0069mage/png;base64,!!notb64"}}]}]}')
    assert b"image" not in raw
    r = _post(px, px.register("r1"), raw)
    assert r.status_code == 400 and "not valid base64" in r.json()["error"]["message"]
    assert px.up.double.requests == []


def test_undecodable_image_in_a_rewritten_history_is_400_before_upstream(px):
    """The image check covers every message that differs from the previous call's, not only the appended ones."""
    token = px.register("r1")
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert _post(px, token, {"model": "m", "messages": history}).status_code == 200
    bad = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!notb64"}}]
    rewritten = [{"role": "user", "content": bad}, *history[1:], {"role": "user", "content": "d"}]
    r = _post(px, token, {"model": "m", "messages": rewritten})
    assert r.status_code == 400 and "not valid base64" in r.json()["error"]["message"]
    assert len(px.up.double.requests) == 1  # the bad request never went upstream


def test_upstream_down_is_502_and_recorded_as_infra_error(px):
    px.up.server.stop()
    client = px.client(px.register("r1"))
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="m", messages=USER)
    assert info.value.status_code == 502 and "unreachable" in str(info.value)
    with pytest.raises(openai.InternalServerError):
        list(client.chat.completions.create(model="m", messages=USER, stream=True))
    calls = px.calls("r1")
    assert [c.error_class for c in calls] == ["upstream_unreachable"] * 2
    assert not any(c.token_exact for c in calls)
    assert httpx.get(px.url + "/health").json()["in_flight"] == 0  # every failed call left the count it entered


def test_every_way_a_call_ends_leaves_the_in_flight_count(px):
    """Pause/drain waits for in-flight calls to reach zero: no path may leave a call counted, or count it twice."""
    client = px.client(px.register("r1"))
    px.up.double.script.extend([HTTPError(400, "bad"), HTTPError(400, "bad"), Text("ok"), Text("ok"),
                                Text("a long answer that will not finish", disconnect_after=3),
                                Delay(0.0, chunk_delay=0.05, then=Text("word " * 40))])
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError):
            r = client.chat.completions.create(model="m", messages=USER, stream=stream)
            list(r) if stream else None
    client.chat.completions.create(model="m", messages=USER)
    list(client.chat.completions.create(model="m", messages=USER, stream=True))
    with pytest.raises(Exception):  # noqa: B017 - the SDK's error for a cut stream varies
        list(client.chat.completions.create(model="m", messages=USER, stream=True))
    stream = client.chat.completions.create(model="m", messages=USER, stream=True)
    next(iter(stream))
    stream.close()  # the client leaves mid-stream
    r = _post(px, px.register("r2"), {"model": "m", "messages": "not a list"})
    assert r.status_code == 400
    import time

    deadline = time.monotonic() + 10
    while httpx.get(px.url + "/health").json()["in_flight"] != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(px.url + "/health").json()["in_flight"] == 0


def test_upstream_timeout_is_504(up, tmp_path):
    px, serve = make_proxy(up, tmp_path, proxy_read_timeout_s=0.3)
    try:
        up.double.script.extend([Delay(2.0)])
        with pytest.raises(openai.APIStatusError) as info:
            px.client(px.register("r1")).chat.completions.create(model="m", messages=USER)
        assert info.value.status_code == 504
        (call,) = px.calls("r1")
        assert call.error_class == "upstream_timeout"
    finally:
        serve.stop()
        px.store.close()


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_4xx_is_passed_through_and_recorded(px, stream):
    px.up.double.script.extend([HTTPError(400, "This model's maximum context length is 8192 tokens")])
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        r = px.client(px.register("r1")).chat.completions.create(model="m", messages=USER, stream=stream)
        list(r) if stream else None
    (call,) = px.calls("r1")
    assert call.upstream_status == 400 and call.error_class == "upstream_http_400" and not call.token_exact


def test_error_event_mid_stream_reaches_the_client_and_the_store(px):
    px.up.double.script.extend([HTTPError(500, "engine died", after_chunks=2)])
    client = px.client(px.register("r1"))
    with pytest.raises(openai.APIError, match="engine died"):
        list(client.chat.completions.create(model="m", messages=USER, stream=True))
    (call,) = px.calls("r1")
    assert call.error_class == "upstream_stream_error" and not call.token_exact


def test_upstream_dropping_a_stream_is_recorded_as_truncated(px):
    px.up.double.script.extend([Text("a long answer that will not finish", disconnect_after=3)])
    client = px.client(px.register("r1"))
    with pytest.raises(Exception):
        list(client.chat.completions.create(model="m", messages=USER, stream=True))
    (call,) = px.calls("r1")
    assert call.error_class in ("upstream_stream_truncated", "upstream_unreachable") and not call.token_exact
    assert call.completion_token_ids  # what was streamed before the drop is kept


def test_client_disconnecting_mid_stream_is_recorded(px):
    px.up.double.script.extend([Delay(0.0, chunk_delay=0.05, then=Text("word " * 40))])
    client = px.client(px.register("r1"))
    stream = client.chat.completions.create(model="m", messages=USER, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        px.store.flush(5)
        if px.store.calls("r1"):
            break
        time.sleep(0.1)
    (call,) = px.store.calls("r1")
    assert call.error_class == "client_disconnected"
    # the relay stopped with the client (and closed the upstream stream) instead of reading the answer to its end
    assert 0 < len(call.completion_token_ids) < 20


def test_tokens_are_scoped_to_their_rollout(px):
    token_a, token_b = px.register("A"), px.register("B")
    px.client(token_a).chat.completions.create(model="m", messages=USER)
    px.client(token_b).chat.completions.create(model="m", messages=USER)
    assert len(px.calls("A")) == 1 and len(px.calls("B")) == 1
    # a token's rollout id cannot be swapped: re-signing needs the secret
    prefix, rid, exp, sig = token_a.split(".")
    forged = ".".join([prefix, base64.urlsafe_b64encode(b"B").rstrip(b"=").decode(), exp, sig])
    for bad in (forged, "sk-not-a-rollout-token", token_a[:-2] + "xx", "ofr1.x"):
        r = _post(px, bad, {"model": "m", "messages": USER})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", bad
    r = httpx.get(px.url + "/admin/status", headers={"Authorization": f"Bearer {token_a}"})
    assert r.status_code == 401  # a rollout token is not an admin token
    px.end("A", outcome="success")
    with pytest.raises(openai.AuthenticationError, match="has ended"):
        px.client(token_a).chat.completions.create(model="m", messages=USER)
    px.client(token_b).chat.completions.create(model="m", messages=USER)  # B unaffected
    assert len(px.calls("A")) == 1 and len(px.calls("B")) == 2
    assert px.store.rollout("A").outcome == "success"


def test_expired_token_is_401(px):
    token = px.register("r1", ttl_s=-1)
    with pytest.raises(openai.AuthenticationError, match="expired"):
        px.client(token).chat.completions.create(model="m", messages=USER)


def test_a_token_that_worked_stops_working_when_it_expires(px, monkeypatch):
    """Verified tokens are remembered (one HMAC per token, not per call); the expiry is still checked every call."""
    import time

    token = px.register("r1", ttl_s=60)
    px.client(token).chat.completions.create(model="m", messages=USER)
    later = time.time() + 120
    monkeypatch.setattr(time, "time", lambda: later)
    with pytest.raises(openai.AuthenticationError, match="expired"):
        px.client(token).chat.completions.create(model="m", messages=USER)
    assert len(px.calls("r1")) == 1


def test_tokens_survive_a_proxy_restart(up, tmp_path):
    px, serve = make_proxy(up, tmp_path)
    token = px.register("r1")
    px.client(token).chat.completions.create(model="m", messages=USER)
    serve.stop()
    px.store.close()
    px2, serve2 = make_proxy(up, tmp_path)  # same home: same secret, same store
    try:
        px2.client(token).chat.completions.create(model="m", messages=USER)
        assert len(px2.calls("r1")) == 2
    finally:
        serve2.stop()
        px2.store.close()


def test_no_key_is_401_unless_unbound_calls_are_allowed(up, tmp_path):
    px, serve = make_proxy(up, tmp_path)
    try:
        r = httpx.post(px.url + "/v1/chat/completions", json={"model": "m", "messages": USER})
        assert r.status_code == 401 and "no API key" in r.json()["error"]["message"]
    finally:
        serve.stop()
        px.store.close()
    px, serve = make_proxy(up, tmp_path / "b", proxy_allow_unbound=True)
    try:
        r = httpx.post(px.url + "/v1/chat/completions", json={"model": "m", "messages": USER})
        assert r.status_code == 200
        px.store.flush(10)
        assert px.store.counts()["calls"] == 1
    finally:
        serve.stop()
        px.store.close()


def test_bad_admin_requests(px):
    r = px.admin("POST", "/admin/rollouts", json={"bogus": 1})  # an authenticated bad body: 400, naming the field
    assert r.status_code == 400 and "bogus" in r.text
    assert px.admin("POST", "/admin/rollouts/x/end", json={"outcome": "exploded"}).status_code == 400
    r = px.admin("POST", "/admin/rollouts", json={"rollout_id": "x" * 200})  # past the store's 128 characters
    assert r.status_code == 400 and "at most 128" in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "invalid_record"
    r = httpx.post(px.url + "/admin/pause", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401


def test_a_bug_in_the_proxy_is_a_500_in_the_apis_shape_and_the_next_call_works(px, monkeypatch, caplog):
    from proxy._protocols import openai_chat

    token = px.register("r1")
    real = openai_chat.prepare
    monkeypatch.setattr(openai_chat, "prepare", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    r = _post(px, token, {"model": "m", "messages": USER})
    assert r.status_code == 500 and r.json()["error"]["code"] == "proxy_internal_error"
    assert any("boom" in (rec.exc_text or "") for rec in caplog.records)  # the traceback is in the log
    monkeypatch.setattr(openai_chat, "prepare", real)
    assert _post(px, token, {"model": "m", "messages": USER}).status_code == 200
    assert httpx.get(px.url + "/health").json()["in_flight"] == 0


@pytest.mark.parametrize("fsync", [False, True], ids=["no-fsync", "fsync"])
@pytest.mark.parametrize("when", ["prompt", "answer"])
def test_a_journal_that_cannot_write_withholds_the_answer_with_a_503(up, tmp_path, monkeypatch, fsync, when):
    """The disk under the journal fails (no space): a call whose record cannot be written gets 503 record_failed,
    not an answer that would go unrecorded, whether the failure hits the prompt's bodies (journaled while the
    upstream works) or the call's own record; the journal then refuses until reopened, and says so."""
    import errno

    from forge_store._write import journal as journal_module
    from forge_store._write.journal_files import HEADER
    from forge_store._write.op_codec import unpack_op

    refused: list[str] = []  # the kind of each journal operation the disk refused

    class FullDisk:  # the journal module's ``os``, whose writes fail; every other call goes to the real one
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def writev(fd, parts):
            return FullDisk.write(fd, b"".join(parts))

        @staticmethod
        def write(fd, data):
            size = HEADER.size
            refused.append(unpack_op(bytes(data[size:size + HEADER.unpack(data[:size])[0]]))["k"])
            raise OSError(errno.ENOSPC, "No space left on device")

    harness, serve = make_proxy(up, tmp_path, proxy_journal_fsync=fsync)
    try:
        token = harness.register("r1")
        assert _post(harness, token, {"model": "m", "messages": USER}).status_code == 200
        monkeypatch.setattr(journal_module, "os", FullDisk())
        # "answer": the first call's prompt again, so nothing is journaled ahead and the call's own record fails
        r = _post(harness, token, {"model": "m", "messages": USER if when == "answer" else
                                   [{"role": "user", "content": "a new prompt, its body new to the journal"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "record_failed"
        assert "withheld" in r.json()["error"]["message"]
        assert refused == ["msgs" if when == "prompt" else "call"]  # the write this case is about, and no other
        monkeypatch.setattr(journal_module, "os", os)
        again = _post(harness, token, {"model": "m", "messages": USER})  # the journal stays failed: still 503
        assert again.status_code == 503 and again.json()["error"]["code"] == "record_failed"
        assert "openforge_proxy_record_failures_total 2.0" in httpx.get(harness.url + "/metrics").text
        assert httpx.get(harness.url + "/health").json()["in_flight"] == 0
    finally:
        serve.stop()
        with contextlib.suppress(Exception):  # closing flushes through the failed journal, which refuses
            harness.store.close()
