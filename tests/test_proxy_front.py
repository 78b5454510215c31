"""The proxy's own HTTP server (``proxy._http``) on raw sockets: what HTTP/1.1 clients other than the SDKs do.

The SDK-level tests (test_proxy*.py) run through this server already; these cover the wire: pipelining, limits,
malformed requests, 100-continue, HTTP/1.0, websocket handshakes, a client that stops reading, and stopping with
calls in flight. The last tests serve the same ``ProxyApp`` on uvicorn: it stays a plain ASGI app.

One job, the wire behaviour of one server, with the raw-socket helpers its tests share; over 400 lines because
HTTP/1.1 has that many corners. Its limits for untrusted clients have their own file (test_proxy_limits.py).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest

from proxy.engines.scripted import Delay, Text
from tests.proxy_fixtures import ServeInThread, make_proxy, running_proxy

USER = [{"role": "user", "content": "hello"}]


def _connect(px, rcvbuf: int | None = None) -> socket.socket:
    host, port = px.url.removeprefix("http://").split(":")
    s = socket.socket()
    if rcvbuf:  # before connect, so that the window the proxy sees is small from the start
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(10)
    s.connect((host, int(port)))
    return s


def _request(token: str, body: dict | bytes, path="/v1/chat/completions", *, extra: str = "",
             version: str = "1.1") -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (f"POST {path} HTTP/{version}\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n{extra}\r\n").encode() + raw


def _read_responses(s: socket.socket, n: int) -> list[httpx.Response]:
    """Parse ``n`` responses off a raw socket (content-length or chunked bodies)."""
    buf, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, f"connection closed after {len(out)} of {n} responses: {buf[:200]!r}"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.split(": ", 1) for line in lines[1:])
        headers = {k.lower(): v for k, v in headers.items()}
        if "content-length" in headers:
            size = int(headers["content-length"])
            while len(buf) < size:
                buf += s.recv(65536)
            body, buf = buf[:size], buf[size:]
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                while b"\r\n" not in buf:
                    buf += s.recv(65536)
                size_line, buf = buf.split(b"\r\n", 1)
                size = int(size_line, 16)
                while len(buf) < size + 2:
                    buf += s.recv(65536)
                body, buf = body + buf[:size], buf[size + 2:]
                if size == 0:
                    break
        else:
            body = b""
        out.append(httpx.Response(status, headers=headers, content=body))
    return out


def test_pipelined_requests_are_answered_in_order(px):
    token = px.register("r1")
    px.up.double.script.extend([Delay(0.2, then=Text("first")), Text("second")])
    with _connect(px) as s:
        s.sendall(_request(token, {"model": "m", "messages": USER})
                  + _request(token, {"model": "m", "messages": [{"role": "user", "content": "again"}]})
                  + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first, second, health = _read_responses(s, 3)
    assert first.json()["choices"][0]["message"]["content"] == "first"  # slower, still first
    assert second.json()["choices"][0]["message"]["content"] == "second"
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert len(px.calls("r1")) == 2


def test_requests_answered_before_any_wait_and_calls_mixed_in_one_write_keep_their_order(px):
    """A model call starts in the step that parsed it (``start_eagerly``), and a refusal (bad JSON, a forged
    token) is answered there outright, before any wait: pipelined in one write with calls and a FastAPI route, every
    answer still comes in order, and the connection stays usable afterwards."""
    token = px.register("r1")
    px.up.double.script.extend([Delay(0.1, then=Text("first")), Text("second")])
    with _connect(px) as s:
        s.sendall(_request(token, b"{not json")
                  + _request(token, {"model": "m", "messages": USER})
                  + _request("forged", {"model": "m", "messages": USER})
                  + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                  + _request(token, {"model": "m", "messages": [{"role": "user", "content": "again"}]}))
        bad, first, forged, health, second = _read_responses(s, 5)
        s.sendall(_request(token, b"[]"))
        (late,) = _read_responses(s, 1)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    assert first.json()["choices"][0]["message"]["content"] == "first"
    assert forged.status_code == 401 and health.json()["status"] == "ok"
    assert second.json()["choices"][0]["message"]["content"] == "second"
    assert late.status_code == 400 and "not an object" in late.json()["error"]["message"]
    assert len(px.calls("r1")) == 2


def test_a_coroutine_started_eagerly_runs_to_its_first_wait_at_once_and_then_as_a_task():
    import asyncio

    from proxy._http.eager import start_eagerly

    steps = []

    async def call(fut):
        steps.append("before the wait")
        try:
            value = await fut
        except asyncio.CancelledError:
            steps.append("cancelled")
            raise
        steps.append(f"after: {value}")
        await asyncio.sleep(0)
        return value * 2

    async def whole():
        steps.append("no wait")
        return "done"

    async def main():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        task = start_eagerly(loop, call(fut))
        assert steps == ["before the wait"]  # ran in this step, no loop turn
        fut.set_result(21)
        assert await task == 42 and steps[-1] == "after: 21"
        other = loop.create_future()
        task = start_eagerly(loop, call(other))
        await asyncio.sleep(0)
        task.cancel()  # thrown through to the coroutine where it waits
        with pytest.raises(asyncio.CancelledError):
            await task
        assert steps[-1] == "cancelled"
        failing = loop.create_future()
        task = start_eagerly(loop, call(failing))
        failing.set_exception(ValueError("upstream"))
        with pytest.raises(ValueError, match="upstream"):
            await task
        assert start_eagerly(loop, whole()) is None and steps[-1] == "no wait"  # finished without a wait

    asyncio.run(main())


def test_keep_alive_serves_many_calls_on_one_connection_and_http10_closes(px):
    token = px.register("r1")
    with _connect(px) as s:
        for i in range(5):
            s.sendall(_request(token, {"model": "m", "messages": [{"role": "user", "content": f"turn {i}"}]}))
            (r,) = _read_responses(s, 1)
            assert r.status_code == 200 and "connection" not in r.headers
        s.sendall(_request(token, {"model": "m", "messages": USER}, version="1.0"))
        (r,) = _read_responses(s, 1)
        assert r.status_code == 200 and r.headers["connection"] == "close"
        assert s.recv(10) == b""  # and it did close
    assert len(px.calls("r1")) == 6


def test_declared_body_over_the_limit_is_413_while_the_client_is_still_sending(up, tmp_path):
    with running_proxy(up, tmp_path, proxy_max_body_bytes=64 << 10) as px:
        token = px.register("r1")
        with _connect(px) as s:
            body = b"x" * (4 << 20)
            s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode())
            try:  # the proxy answers without reading the body; the upload may or may not get through
                s.sendall(body)
            except (BrokenPipeError, ConnectionResetError):
                pass
            (r,) = _read_responses(s, 1)
        assert r.status_code == 413 and "limit of 65,536 bytes" in r.json()["error"]["message"]
        assert r.headers["connection"] == "close" and up.double.requests == []
        assert 'openforge_proxy_errors_total{code="body_too_large",status="413"} 1.0' in httpx.get(px.url + "/metrics").text


def test_chunked_body_over_the_limit_is_413_and_a_chunked_body_under_it_is_served(up, tmp_path):
    with running_proxy(up, tmp_path, proxy_max_body_bytes=4096) as px:
        token = px.register("r1")
        small = json.dumps({"model": "m", "messages": USER}).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                "Transfer-Encoding: chunked\r\n\r\n").encode()
        with _connect(px) as s:
            s.sendall(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(small), small))
            (ok,) = _read_responses(s, 1)
            s.sendall(head + b"".join(b"%x\r\n%s\r\n" % (1000, b"y" * 1000) for _ in range(8)) + b"0\r\n\r\n")
            (big,) = _read_responses(s, 1)
        assert ok.status_code == 200
        assert big.status_code == 413 and "limit of 4,096 bytes" in big.json()["error"]["message"]


@pytest.mark.parametrize("raw, status, fragment", [
    (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: nope\r\n\r\n", 400, "malformed HTTP request"),
    (b"GARBAGE\x00\r\n\r\n", 400, "malformed HTTP request"),
    (b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * (70 << 10) + b"\r\n\r\n", 431, "over the proxy's limit"),
])
def test_malformed_http_gets_a_clear_error_and_a_closed_connection(px, raw, status, fragment):
    with _connect(px) as s:
        s.sendall(raw)
        (r,) = _read_responses(s, 1)
        assert r.status_code == status and fragment in r.json()["error"]["message"]
        assert s.recv(10) == b""
    assert httpx.get(px.url + "/health").status_code == 200  # the server goes on


def test_garbage_after_a_complete_request_does_not_spoil_it(px):
    with _connect(px) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE\x00\r\n\r\n")
        health, bad = _read_responses(s, 2)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert bad.status_code == 400 and "malformed HTTP request" in bad.json()["error"]["message"]


def test_expect_100_continue(px):
    token = px.register("r1")
    body = json.dumps({"model": "m", "messages": USER}).encode()
    with _connect(px) as s:
        s.sendall(_request(token, body, extra="Expect: 100-continue\r\n")[:-len(body)])
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        (r,) = _read_responses(s, 1)
    assert r.status_code == 200 and len(px.calls("r1")) == 1


def test_expect_100_continue_on_a_body_over_the_limit_gets_the_413_instead(up, tmp_path):
    with running_proxy(up, tmp_path, proxy_max_body_bytes=4096) as px:
        with _connect(px) as s:  # Expect before Content-Length: the limit still decides first
            s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {px.register('r1')}\r\n"
                       "Expect: 100-continue\r\nContent-Length: 100000\r\n\r\n").encode())
            (r,) = _read_responses(s, 1)
        assert r.status_code == 413


def test_websocket_handshake_is_refused_in_the_responses_shape(px):
    token = px.register("r1")
    with _connect(px) as s:
        s.sendall((f"GET /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: Upgrade\r\n"
                   "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
                  .encode())
        (r,) = _read_responses(s, 1)
        assert r.status_code == 405 and r.json()["error"]["code"] == "websocket_not_supported"
        assert s.recv(10) == b""


def test_a_client_that_stops_reading_holds_back_only_its_own_stream(up, tmp_path):
    """Backpressure: a stream whose client reads nothing waits once the socket's buffers are full (the proxy does not
    queue the whole answer in memory); other calls go on, and the stalled one is recorded, cut where the client
    stopped, when its client leaves."""
    with running_proxy(up, tmp_path) as px:
        up.double.script.extend([Text("word " * 6000)])
        token = px.register("stalled")
        before = set(px.server.connections)
        s = _connect(px, rcvbuf=4096)
        deadline = time.monotonic() + 5
        while not (set(px.server.connections) - before) and time.monotonic() < deadline:
            time.sleep(0.01)
        (conn,) = set(px.server.connections) - before
        # loopback's autotuned send buffer would swallow the whole answer (megabytes): a small one makes it wait
        conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        s.sendall(_request(token, {"model": "m", "messages": USER, "stream": True, "max_tokens": 7000}))
        time.sleep(1.0)
        # held back, not queued: at most the transport's high-water mark (64 KiB) plus the events of one upstream
        # read, relayed in one write (asyncio reads up to 256 KiB at once: under load the engine's events pile up
        # into such reads, 337 KB buffered in one CI run), never the whole answer (over a megabyte); and the call
        # is not recorded yet, which happens only once the answer has been written out
        assert conn.transport.get_write_buffer_size() < 512 << 10
        assert not px.calls("stalled")
        other = px.client(px.register("other")).chat.completions.create(model="m", messages=USER)
        assert other.choices[0].message.content
        s.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not px.calls("stalled"):
            time.sleep(0.1)
        (call,) = px.calls("stalled")
        assert call.error_class == "client_disconnected"
        assert 0 < len(call.completion_token_ids) < 6000  # it stopped where the client stopped reading


def test_stop_lets_calls_in_flight_finish_and_refuses_new_ones(up, tmp_path):
    px, serve = make_proxy(up, tmp_path)
    try:
        up.double.script.extend([Delay(0.5, then=Text("finished"))])
        client = px.client(px.register("r1"))
        got = {}
        t = threading.Thread(target=lambda: got.setdefault(
            "answer", client.chat.completions.create(model="m", messages=USER)))
        t.start()
        time.sleep(0.2)
        serve.stop()
        t.join(10)
        assert got["answer"].choices[0].message.content == "finished"
        with pytest.raises(httpx.ConnectError):
            httpx.get(px.url + "/health", timeout=2)
        assert len(px.calls("r1")) == 1
    finally:
        px.store.close()


# ---- the same ProxyApp on uvicorn: any ASGI server can serve it ----------------------------------------------------
@pytest.fixture
def px_uvicorn(up, tmp_path):
    from forge_store import Settings
    from proxy import ProxySettings, build_proxy
    from tests.proxy_fixtures import ProxyHarness

    proxy = build_proxy(up.url, settings=Settings(home=tmp_path / "home"),
                        proxy_settings=ProxySettings(max_body_bytes=4096),
                        store_url=f"sqlite:///{tmp_path / 'proxy.sqlite'}")
    serve = ServeInThread(proxy.app, server="uvicorn")
    assert serve.kind == "uvicorn"
    harness = ProxyHarness(proxy, serve.start(), up)
    yield harness
    serve.stop()
    proxy.store.close()


def test_the_asgi_app_serves_calls_streams_limits_and_disconnects_on_uvicorn(px_uvicorn):
    px = px_uvicorn
    client = px.client(px.register("r1"))
    assert client.chat.completions.create(model="m", messages=USER).choices[0].message.content
    text = "".join(c.choices[0].delta.content or "" for c in
                   client.chat.completions.create(model="m", messages=USER, stream=True) if c.choices)
    assert text
    with pytest.raises(openai.APIStatusError, match="limit of 4,096 bytes"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 10_000}])
    px.up.double.script.extend([Delay(0.0, chunk_delay=0.05, then=Text("word " * 40))])
    stream = px.client(px.register("r2")).chat.completions.create(model="m", messages=USER, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not px.calls("r2"):
        time.sleep(0.1)
    (call,) = px.calls("r2")
    assert call.error_class == "client_disconnected" and 0 < len(call.completion_token_ids) < 20
    assert len(px.calls("r1")) == 2


def test_a_server_that_cannot_start_says_so_at_once(up, tmp_path):
    from forge_store import Settings
    from proxy import build_proxy
    from proxy import HttpServer

    proxy = build_proxy(up.url, settings=Settings(home=tmp_path / "home"),
                        store_url=f"sqlite:///{tmp_path / 'proxy.sqlite'}")
    try:
        sock = socket.socket()
        sock.close()  # not a socket one can listen on
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="did not start: OSError") as info:  # the cause, not a timeout
            HttpServer(proxy.app, max_body=1 << 20).start_in_thread([sock], timeout_s=10)
        assert time.monotonic() - t0 < 5 and isinstance(info.value.__cause__, OSError)
    finally:
        proxy.store.close()


def test_the_cli_refuses_an_unknown_log_level_and_stops_cleanly_on_sigterm(up, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from tests.netfault import free_port

    openforge = str(Path(sys.executable).parent / "openforge")
    env = {**os.environ, "OPENFORGE_HOME": str(tmp_path / "home"), "OPENFORGE_PROXY_ADMIN_TOKEN": "t" * 24}
    store = f"sqlite:///{tmp_path / 'cli.sqlite'}"
    bad = subprocess.run([openforge, "proxy", "--upstream", up.url, "--store", store, "--log-level", "loud"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--log-level 'loud' unknown" in bad.stderr
    port = free_port()
    proc = subprocess.Popen([openforge, "proxy", "--upstream", up.url, "--store", store, "--port", str(port)],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, "the proxy did not come up"
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "admin token from OPENFORGE_PROXY_ADMIN_TOKEN" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_call_ids_are_unique_hex_and_a_forked_child_draws_its_own():
    import os

    from proxy._call_ids import call_ids

    ids = [call_ids.next() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: an id from its own prefix, then out without running the parent's cleanup
        os.write(write, call_ids.next().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert child[:16] != ids[0][:16] and child not in ids
