"""Upstreams that answer badly, as real HTTP servers standing in for an engine (a stream that turns to garbage, a
200 that is no chat completion, finish reasons of an engine's own): the client gets a clear answer and the store
keeps what happened."""

from __future__ import annotations

import contextlib
import json
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from tests.proxy_fixtures import make_proxy

USER = [{"role": "user", "content": "hello"}]


@contextlib.contextmanager
def _proxy_before(handler: type[BaseHTTPRequestHandler], tmp_path):
    """A recording proxy in front of a real HTTP server answering with ``handler``; yields the proxy and an openai
    client for its registered rollout ``r1``."""
    from forge_store import Settings
    from proxy import build_proxy
    from tests.proxy_fixtures import ServeInThread

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = build_proxy(f"http://127.0.0.1:{server.server_port}", settings=Settings(home=tmp_path / "h"),
                        store_url=f"sqlite:///{tmp_path / 's.sqlite'}")
    serve = ServeInThread(proxy.app)
    url = serve.start()
    try:
        token = proxy.signer.issue("r1")
        proxy.service.rollouts.register("r1")
        yield proxy, openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
    finally:
        serve.stop()
        server.shutdown()
        proxy.store.close()


def test_upstream_sending_garbage_mid_stream_is_a_protocol_error(tmp_path):
    """A real HTTP server that answers a stream with one good chunk, then bytes that are not JSON."""

    class Broken(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            good = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}]}
            self.wfile.write(b"data: " + json.dumps(good).encode() + b"\n\ndata: {not json\n\n")
            self.wfile.flush()

        def log_message(self, *args):
            pass

    with _proxy_before(Broken, tmp_path) as (proxy, client):
        with pytest.raises(openai.APIError, match="not JSON"):
            list(client.chat.completions.create(model="m", messages=USER, stream=True))
        proxy.store.flush(10)
        (call,) = proxy.store.calls("r1")
        assert call.error_class == "upstream_protocol" and call.response["text"] == "hi"


def test_an_engines_finish_reason_past_the_stores_column_is_kept_in_the_metadata(tmp_path, pg_database):
    """A real HTTP server standing in for an engine with finish reasons of its own (longer than the store's 32
    characters, which PostgreSQL enforces): the client gets the answer as sent, the call is stored with the reason
    cut to fit and whole in its metadata."""
    reason = "stopped_by_an_engine_specific_rule_number_7"

    class Engine(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                               "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                            "finish_reason": reason}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    px, serve = make_proxy(types.SimpleNamespace(url=f"http://127.0.0.1:{server.server_port}"), tmp_path,
                           store_url=pg_database)
    try:
        client = px.client(px.register("r1"))
        for _ in range(2):
            r = client.chat.completions.create(model="m", messages=USER)
            assert r.choices[0].finish_reason == reason and r.choices[0].message.content == "ok"
        calls = px.calls("r1")
        assert len(calls) == 2 and px.store.writer_status()["dead_letters"] == 0
        assert calls[0].finish_reason == reason[:32] and calls[0].metadata["finish_reason"] == reason
    finally:
        serve.stop()
        server.shutdown()
        px.store.close()


def test_an_answer_the_protocol_cannot_read_is_a_recorded_502(tmp_path):
    """A 200 whose JSON is no chat completion (``choices`` a number), asked through the Responses API: the client
    gets the 502, and the call is stored with ``upstream_protocol`` (it used to be lost)."""

    class Odd(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"id": "x", "object": "chat.completion", "model": "m", "choices": 5}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with _proxy_before(Odd, tmp_path) as (proxy, client):
        with pytest.raises(openai.APIStatusError) as err:
            client.responses.create(model="m", input="hi")
        assert err.value.status_code == 502
        proxy.store.flush(10)
        (call,) = proxy.store.calls("r1")
        assert call.error_class == "upstream_protocol" and call.api_surface == "responses"
        assert err.value.response.headers["x-openforge-call-id"] == call.id
