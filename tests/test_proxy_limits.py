"""The limits of the proxy's HTTP server (``proxy._http.limits``) against hostile clients, on raw loopback sockets.

Every sandbox reaches the proxy: these are the clients a reviewer aimed at it. A trickled head or body, an idle
keep-alive connection, an endless header section, a client that pipelines without reading, one that never reads
its answer, more connections than the cap, and 500 slow or idle connections next to a normal client. The proxy
runs in this process (``build_proxy`` and ``HttpServer`` on a thread, limits from ``ProxySettings``), so its buffers can
be looked at directly and its RSS is this process's.
"""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import statistics
import threading
import time

import pytest

from proxy import HttpServer, build_proxy
from proxy._http import HttpLimits
from proxy.engines.scripted import Text
from tests.proxy_fixtures import ProxyHarness, split_settings
from tests.test_proxy_front import USER, _read_responses, _request

HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


@contextlib.contextmanager
def limited_proxy(up, tmp_path, **limits):
    """A proxy whose HTTP limits are ``limits`` (``proxy_*`` settings), served in this process."""
    settings, ps = split_settings(tmp_path / "home", limits)
    proxy = build_proxy(up.url, settings=settings, store_url=f"sqlite:///{tmp_path / 'proxy.sqlite'}",
                        proxy_settings=ps)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = HttpServer(proxy.app, max_body=ps.max_body_bytes, limits=HttpLimits.from_settings(ps),
                        graceful_s=2)
    server.start_in_thread([sock])
    try:
        yield ProxyHarness(proxy, f"http://127.0.0.1:{sock.getsockname()[1]}", up, server)
    finally:
        server.stop()
        server.join(10)
        proxy.store.close()


def _connect(px, rcvbuf: int | None = None, timeout: float = 10) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    s.connect(("127.0.0.1", int(px.url.rsplit(":", 1)[1])))
    return s


def _read_to_eof(s: socket.socket) -> bytes:
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(65536):
            out += chunk
    return out


def _server_side(px, before: set):
    deadline = time.monotonic() + 5
    while not (set(px.server.connections) - before) and time.monotonic() < deadline:
        time.sleep(0.005)
    (conn,) = set(px.server.connections) - before
    return conn


def _rss() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) << 10 for line in fh if line.startswith("VmRSS:"))


def _trickle(s: socket.socket, data: bytes, every_s: float, stop: threading.Event) -> None:
    for i in range(len(data)):
        if stop.wait(every_s):
            return
        try:
            s.send(data[i:i + 1])
        except OSError:
            return


def test_a_trickled_head_gets_408_and_is_closed_at_its_deadline_not_later(up, tmp_path):
    """One byte every 0.1 s keeps a connection busy but never completes a head: the deadline runs from the
    connect, not from the last byte. A fresh connection that sends nothing is closed at the same deadline."""
    with limited_proxy(up, tmp_path, proxy_head_timeout_s=1.0) as px:
        t0 = time.monotonic()
        silent = _connect(px)
        s = _connect(px)
        stop = threading.Event()
        threading.Thread(target=_trickle, args=(s, b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 200, 0.1, stop),
                         daemon=True).start()
        try:
            answer = _read_to_eof(s)
            took = time.monotonic() - t0
        finally:
            stop.set()
        assert answer.startswith(b"HTTP/1.1 408 ") and b"request_timeout" in answer, answer[:300]
        assert 0.9 < took < 1.6, took
        assert _read_to_eof(silent) == b"" and time.monotonic() - t0 < 1.6


def test_a_trickled_body_gets_408_at_the_body_deadline(up, tmp_path):
    with limited_proxy(up, tmp_path, proxy_body_timeout_s=1.0) as px:
        token = px.register("r1")
        request = _request(token, {"model": "m", "messages": USER})
        head, body = request.split(b"\r\n\r\n", 1)
        s = _connect(px)
        s.sendall(head + b"\r\n\r\n")
        t0 = time.monotonic()
        stop = threading.Event()
        threading.Thread(target=_trickle, args=(s, body, 0.05, stop), daemon=True).start()
        try:
            answer = _read_to_eof(s)
            took = time.monotonic() - t0
        finally:
            stop.set()
        assert answer.startswith(b"HTTP/1.1 408 ") and b"body" in answer, answer[:300]
        assert 0.9 < took < 1.6, took


def test_an_idle_keep_alive_connection_closes_after_the_idle_timeout(up, tmp_path):
    with limited_proxy(up, tmp_path, proxy_idle_timeout_s=0.5) as px:
        s = _connect(px)
        s.sendall(HEALTH)
        (r,) = _read_responses(s, 1)
        assert r.status_code == 200
        t0 = time.monotonic()
        assert _read_to_eof(s) == b""
        assert 0.4 < time.monotonic() - t0 < 1.2
        # the timer is the connection's, not the last byte's: a kept-alive client that sends requests stays
        s = _connect(px)
        for _ in range(4):
            time.sleep(0.3)
            s.sendall(HEALTH)
            assert _read_responses(s, 1)[0].status_code == 200


def test_an_endless_header_section_gets_431_as_it_arrives_and_memory_does_not_grow(up, tmp_path):
    """The header section never ends: the 431 comes once the limit is passed (not at an end of headers that never
    comes), and what the client sends after it is discarded, not held."""
    with limited_proxy(up, tmp_path, proxy_max_head_bytes=16 << 10) as px:
        s = _connect(px)
        s.setblocking(False)
        rss0, sent, answer = _rss(), 0, b""
        s.send(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        piece = b"a" * (64 << 10)
        deadline = time.monotonic() + 20
        while sent < (64 << 20) and time.monotonic() < deadline:
            with contextlib.suppress(BlockingIOError):
                sent += s.send(piece)
            with contextlib.suppress(BlockingIOError):
                answer += s.recv(65536)
            if b"\r\n\r\n" in answer and sent > (32 << 20):
                break
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:300]
        assert b"headers_too_large" in answer
        assert _rss() - rss0 < (16 << 20), f"RSS grew by {(_rss() - rss0) >> 20} MB while {sent >> 20} MB were sent"
        s.close()


def test_pipelining_without_reading_holds_a_bounded_backlog_and_the_write_timeout_cuts_the_client(up, tmp_path):
    """A client pipelines /health as fast as the socket takes it and reads nothing: the proxy stops reading once
    ``max_pipelined`` requests wait, writes nothing more once the client's socket is full, and cuts it after the
    write timeout. Its queue, unparsed bytes and output stay small whatever was sent."""
    with limited_proxy(up, tmp_path, proxy_max_pipelined=16, proxy_write_timeout_s=3.0) as px:
        before = set(px.server.connections)
        s = _connect(px, rcvbuf=4096)
        conn = _server_side(px, before)
        s.setblocking(False)
        rss0, sent, blocked_since, peak = _rss(), 0, None, {"queue": 0, "backlog": 0, "output": 0}
        burst = HEALTH * 1000
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20:
            try:
                sent += s.send(burst)
                blocked_since = None
            except BlockingIOError:
                blocked_since = blocked_since or time.monotonic()
                if time.monotonic() - blocked_since > 1.0:
                    break
                time.sleep(0.005)
            except OSError:
                break
            if not conn.gone:
                peak["queue"] = max(peak["queue"], len(conn.queue))
                peak["backlog"] = max(peak["backlog"], len(conn.backlog))
                peak["output"] = max(peak["output"], conn.transport.get_write_buffer_size())
        assert sent > len(HEALTH) * 2000, sent  # thousands of requests went out
        assert sent < (64 << 20), sent  # and then the proxy stopped taking them
        # one 64 KiB piece of tiny requests is parsed before reading stops: that many at most wait in the queue
        assert peak["queue"] <= 16 + (64 << 10) // len(HEALTH), peak
        assert peak["backlog"] <= 1 << 20 and peak["output"] <= 256 << 10, peak
        assert _rss() - rss0 < (32 << 20), f"RSS grew by {(_rss() - rss0) >> 20} MB"
        deadline = time.monotonic() + 10
        while not conn.gone and time.monotonic() < deadline:
            time.sleep(0.05)
        assert conn.gone, "a client that reads nothing is cut after the write timeout"
        other = _connect(px)
        other.sendall(HEALTH)
        assert _read_responses(other, 1)[0].status_code == 200


def test_thousands_of_pipelined_requests_read_back_are_all_answered_in_order(up, tmp_path):
    """Reading pauses and resumes (the read-ahead is parsed on resume) without losing or reordering a request."""
    with limited_proxy(up, tmp_path, proxy_max_pipelined=4) as px:
        s = _connect(px)
        n = 3000  # every seventh asks for a path that does not exist: the answers' order shows in their statuses
        requests = b"".join(b"GET /%s?n=%d HTTP/1.1\r\nHost: x\r\n\r\n" % (b"nope" if i % 7 == 3 else b"health", i)
                            for i in range(n))
        threading.Thread(target=s.sendall, args=(requests,), daemon=True).start()
        answers = _read_responses(s, n)
        assert [r.status_code for r in answers] == [404 if i % 7 == 3 else 200 for i in range(n)]


def test_a_client_that_never_reads_a_big_answer_is_cut_after_the_write_timeout(up, tmp_path):
    with limited_proxy(up, tmp_path, proxy_write_timeout_s=1.0) as px:
        up.double.script.extend([Text("word " * 6000)])
        token = px.register("stalled")
        before = set(px.server.connections)
        s = _connect(px, rcvbuf=4096)
        conn = _server_side(px, before)
        conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        s.sendall(_request(token, {"model": "m", "messages": USER, "stream": True, "max_tokens": 7000}))
        t0 = time.monotonic()
        while not conn.gone and time.monotonic() - t0 < 10:
            time.sleep(0.02)
        assert conn.gone and time.monotonic() - t0 < 5
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not px.calls("stalled"):
            time.sleep(0.1)
        (call,) = px.calls("stalled")
        assert call.error_class == "client_disconnected"  # recorded up to where the client stopped reading
        assert 0 < len(call.completion_token_ids) < 6000


def test_past_the_connection_cap_a_new_client_gets_503_and_the_proxy_stays_responsive(up, tmp_path):
    with limited_proxy(up, tmp_path, proxy_max_connections=20) as px:
        held = [_connect(px) for _ in range(20)]
        time.sleep(0.2)
        assert len(px.server.connections) == 20
        for _ in range(50):
            s = _connect(px)
            s.sendall(HEALTH)
            answer = _read_to_eof(s)
            head, body = answer.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in head.lower(), head
            assert json.loads(body)["error"]["code"] == "too_many_connections"
        for s in held[:5]:
            s.close()
        time.sleep(0.2)
        s = _connect(px)
        s.sendall(HEALTH)
        assert _read_responses(s, 1)[0].status_code == 200
        for s in held[5:]:
            s.close()


@pytest.fixture
def many_descriptors():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 8192) if hard != resource.RLIM_INFINITY else 8192
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_normal_client_is_served_quickly_next_to_500_slow_or_idle_connections(up, tmp_path, many_descriptors):
    with limited_proxy(up, tmp_path, proxy_head_timeout_s=30.0) as px:
        idle = [_connect(px) for _ in range(250)]
        slow = [_connect(px) for _ in range(250)]
        for s in slow:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        stop = threading.Event()

        def trickle() -> None:  # one byte to each slow connection every 0.5 s
            while not stop.wait(0.5):
                for s in slow:
                    s.send(b"a")

        threading.Thread(target=trickle, daemon=True).start()
        try:
            time.sleep(0.5)
            assert len(px.server.connections) >= 500
            token = px.register("r1")
            client = px.client(token)
            health, calls = [], []
            for _ in range(5):
                t0 = time.monotonic()
                s = _connect(px)
                s.sendall(HEALTH)
                assert _read_responses(s, 1)[0].status_code == 200
                s.close()
                t1 = time.monotonic()
                assert client.chat.completions.create(model="m", messages=USER).choices[0].message.content
                health.append(t1 - t0)
                calls.append(time.monotonic() - t1)
            assert statistics.median(health) < 0.1 and statistics.median(calls) < 0.1, (health, calls)
        finally:
            stop.set()
            for s in idle + slow:
                s.close()
