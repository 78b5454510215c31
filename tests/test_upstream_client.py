"""The proxy's own upstream HTTP client (``proxy._upstream``) against real servers on loopback: TLS, connection
reuse, a pooled connection the server closed, bodies ended by the connection, and answers cut short."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time

import orjson
import pytest
import uvicorn

from proxy._errors import UpstreamFailure
from proxy._upstream import Upstream
from proxy.engines.scripted import ScriptedUpstream, Text
from tests.netfault import free_port

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


class RawServer:
    """A loopback TCP server whose every connection is handled by ``handler(reader, writer)`` (asyncio, a thread)."""

    def __init__(self, handler):
        self.handler, self.port, self.connections = handler, free_port(), 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def serve():
            async def on_connection(reader, writer):
                self.connections += 1
                await self.handler(reader, writer)

            self.server = await asyncio.start_server(on_connection, "127.0.0.1", self.port)
            ready.set()

        self.thread = threading.Thread(target=lambda: (self.loop.run_until_complete(serve()), self.loop.run_forever()),
                                       daemon=True)
        self.thread.start()
        ready.wait(5)

    def close(self):
        async def stop():
            self.server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def read_request(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")),
                  0)
    return head + await reader.readexactly(length)


def run_against(server: RawServer, fn, **settings):
    """``fn(upstream)`` in a fresh event loop, with an ``Upstream`` on ``server`` (``settings``: its keyword
    arguments) that is closed after."""
    async def main():
        up = Upstream(f"http://127.0.0.1:{server.port}", **settings)
        try:
            return await fn(up)
        finally:
            await up.close()

    return asyncio.run(main())


def test_https_upstream_with_a_trusted_certificate_and_a_refused_one(tmp_path, monkeypatch):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    port = free_port()
    double = ScriptedUpstream()
    double.script.extend([Text("over TLS", times=None)])
    server = uvicorn.Server(uvicorn.Config(double.app, host="127.0.0.1", port=port, log_level="warning",
                                           ssl_certfile=str(cert), ssl_keyfile=str(key), lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            thread.join(0.05)

        async def ask(upstream: Upstream):
            try:
                return await upstream.request("POST", "/v1/chat/completions", CHAT)
            finally:
                await upstream.close()

        with pytest.raises(UpstreamFailure) as refused:  # a certificate nobody vouched for
            asyncio.run(ask(Upstream(f"https://127.0.0.1:{port}")))
        assert refused.value.status == 502 and "CERTIFICATE_VERIFY_FAILED" in refused.value.message
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # how a private CA is trusted (OpenSSL's own variable)
        ans = asyncio.run(ask(Upstream(f"https://127.0.0.1:{port}/v1")))
        assert ans.status == 200 and orjson.loads(ans.body)["choices"][0]["message"]["content"] == "over TLS"
    finally:
        server.should_exit = True
        thread.join(5)


def test_connections_are_reused_and_one_the_server_closed_is_replaced():
    async def handler(reader, writer):
        answered = 0
        while True:  # answer on this connection until the server decides to close it
            try:
                await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            answered += 1
            body = b'{"n": %d}' % server.connections
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            await writer.drain()
            if answered == 3:  # decided by the server alone: a signal from the client could race its check
                writer.close()  # keep-alive promised, then closed while idle (what a server's idle timeout does)
                return

    async def run(up: Upstream):
        first = await up.request("POST", "/x", b"{}")
        second = await up.request("POST", "/x", b"{}")
        assert first.body == second.body == b'{"n": 1}'  # one connection, kept alive
        await up.request("POST", "/x", b"{}")  # answered, then the server closes the connection
        await asyncio.sleep(0.1)
        third = await up.request("POST", "/x", b"{}")  # the pooled one is dead: a new one, silently
        assert third.status == 200 and third.body == b'{"n": 2}'

    server = RawServer(handler)
    try:
        run_against(server, run)
    finally:
        server.close()


def test_an_answer_in_pieces_wakes_its_reader_once_and_the_connection_reads_the_next(monkeypatch):
    """An answer read whole (``request``) whose head and body arrive apart, the body in pieces (one of them past the
    client's 4 MB read-pause mark) and then a second answer on the same kept-alive connection: both whole and in
    order; the reader is woken when the answer is complete (or to drain a paused connection), not per piece."""
    big = b"x" * (5 << 20)
    bodies = [b'{"first": "%s"}' % big, b'{"second": true}']

    async def handler(reader, writer):
        for body in bodies:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                         % len(body))
            await writer.drain()
            for i in range(0, len(body), 1 << 20):
                await asyncio.sleep(0.02)
                writer.write(body[i:i + (1 << 20)])
                await writer.drain()

    from proxy._upstream.connection import UpstreamConnection

    wakes = []
    real_wake = UpstreamConnection._wake
    monkeypatch.setattr(UpstreamConnection, "_wake",
                        lambda self: (wakes.append((self.done, self.paused)), real_wake(self)))
    async def run(up: Upstream):
        first = await up.request("POST", "/x", b"{}")
        first_wakes = list(wakes)
        return first, await up.request("POST", "/x", b"{}"), first_wakes

    server = RawServer(handler)
    try:
        first, second, first_wakes = run_against(server, run)
        assert first.body == bodies[0] and second.body == bodies[1] and server.connections == 1
        # woken for the pause past 4 MB and at the end, never for a piece that neither completed nor paused
        assert first_wakes and all(done or paused for done, paused in first_wakes) and first_wakes[-1][0]
        assert len(first_wakes) <= 3, first_wakes
    finally:
        server.close()


def test_a_body_ended_by_closing_the_connection_is_whole():
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"ok\": true}")
        await writer.drain()
        writer.close()

    server = RawServer(handler)
    try:
        ans = asyncio.run(Upstream(f"http://127.0.0.1:{server.port}").request("POST", "/x", b"{}"))
        assert ans.status == 200 and ans.body == b'{"ok": true}' and ans.content_type == "application/json"
    finally:
        server.close()


@pytest.mark.parametrize("cut", [b"HTTP/1.1 200 OK\r\nContent-Len", b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"a\""],
                         ids=["in-the-head", "in-the-body"])
def test_an_answer_cut_short_is_a_502_not_a_hang(cut):
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(cut)
        await writer.drain()
        writer.close()

    server = RawServer(handler)
    try:
        with pytest.raises(UpstreamFailure) as info:
            asyncio.run(asyncio.wait_for(Upstream(f"http://127.0.0.1:{server.port}").request("POST", "/x", b"{}"), 10))
        assert info.value.status == 502 and info.value.error_class == "upstream_unreachable"
    finally:
        server.close()


def test_silence_past_the_read_timeout_is_a_504():
    async def handler(reader, writer):
        await read_request(reader)
        await asyncio.sleep(5)

    server = RawServer(handler)
    try:
        up = Upstream(f"http://127.0.0.1:{server.port}", read_timeout_s=0.3)
        with pytest.raises(UpstreamFailure) as info:
            asyncio.run(up.request("POST", "/x", b"{}"))
        assert info.value.status == 504 and info.value.error_class == "upstream_timeout"
    finally:
        server.close()


def test_a_stream_that_keeps_coming_outlives_the_read_timeout_and_its_silence_does_not():
    """The read timeout is silence, not the stream's length: pieces 0.15 s apart run past a 0.4 s timeout for as long
    as they come (each wait has the whole timeout); the silence after the last is a 504 about 0.4 s later."""
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(8):
            event = b"data: %d\n\n" % i
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.15)
        await asyncio.sleep(5)

    async def read(up: Upstream):
        stream = await up.open_stream("/x", b"{}")
        got, last = [], 0.0
        with pytest.raises(UpstreamFailure) as info:
            async for events in stream.batches():
                got.extend(events)
                last = asyncio.get_running_loop().time()
        silence = asyncio.get_running_loop().time() - last
        stream.close()
        return got, info.value, silence

    server = RawServer(handler)
    try:
        got, failure, silence = run_against(server, lambda up: asyncio.wait_for(read(up), 20), read_timeout_s=0.4)
        assert got == [b"data: %d" % i for i in range(8)]  # 1.2 s of stream under a 0.4 s timeout
        assert failure.status == 504 and failure.error_class == "upstream_timeout"
        assert 0.4 <= silence < 1.5, silence
    finally:
        server.close()


CHUNK = orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                      "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]})
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def late_end_server(end_after: float | None, ended: list | None = None) -> RawServer:
    """Streams one chat chunk and ``[DONE]`` (flushed), then the transfer's empty last chunk ``end_after`` seconds
    later (None: never), as an engine's server may; then answers the next request on the same connection. Each
    connection's fate goes into ``ended``: "eof" if the client closed it."""
    async def handler(reader, writer):
        while True:
            try:
                await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                if ended is not None:
                    ended.append("eof")
                return
            writer.write(STREAM_HEAD + chunked(b"data: " + CHUNK + b"\n\n") + chunked(b"data: [DONE]\n\n"))
            await writer.drain()
            if end_after is None:
                continue  # the transfer never ends: the next read sees the client's close
            await asyncio.sleep(end_after)
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    return RawServer(handler)


async def stream_to_done(up: Upstream) -> list[bytes]:
    """A stream read the way the proxy's relay reads one: to its ``[DONE]``, then closed as complete."""
    stream = await up.open_stream("/x", b"{}")
    got = []
    async for events in stream.batches():
        got.extend(events)
        if events[-1] == b"data: [DONE]":
            break
    stream.close(complete=True)
    return got


def test_a_stream_closed_at_its_done_keeps_its_connection_when_the_transfers_end_comes_later():
    """``[DONE]`` and the transfer's empty last chunk come apart (50 ms here; on loopback often microseconds, in
    packets of their own): the caller that stops at ``[DONE]`` does not cost the next call a new connection."""
    ended: list[str] = []
    server = late_end_server(0.05, ended)

    async def run(up: Upstream):
        first = await stream_to_done(up)
        await asyncio.sleep(0.15)  # the end has come: the connection is back in the pool
        second = await stream_to_done(up)
        answer = await up.request("POST", "/x", b"{}")  # right after [DONE]: parked, so a fresh connection
        await stream_to_done(up)  # parked again: closing the client closes it, with the pooled one
        await up.close()
        await asyncio.sleep(0.2)
        return first, second, answer, list(ended)

    try:
        first, second, answer, closed = run_against(server, run)
        assert first == second == [b"data: " + CHUNK, b"data: [DONE]"] and answer.status == 200
        assert server.connections == 2, server.connections
        assert closed == ["eof", "eof"], closed
    finally:
        server.close()


def test_a_finished_stream_whose_transfer_never_ends_is_closed_and_one_stopped_early_at_once(monkeypatch):
    from proxy._upstream import connection

    monkeypatch.setattr(connection, "PARK_S", 0.3)
    ended: list[str] = []
    server = late_end_server(None, ended)

    async def run(up: Upstream):
        await stream_to_done(up)
        await asyncio.sleep(0.1)
        parked = list(ended)  # still open, waiting for the transfer's end
        await asyncio.sleep(0.5)
        timed_out = list(ended)  # closed by the park's timeout
        stream = await up.open_stream("/x", b"{}")
        async for _ in stream.batches():
            break
        stream.close()  # stopped early: closed now, so that the server stops generating
        await asyncio.sleep(0.1)
        return parked, timed_out, list(ended)

    try:
        parked, timed_out, stopped = run_against(server, run)
        assert parked == [] and timed_out == ["eof"] and stopped == ["eof", "eof"]
        assert server.connections == 2
    finally:
        server.close()


def test_the_proxy_reuses_the_connection_of_a_relayed_stream_whose_end_came_after_its_done(tmp_path):
    """Through the proxy, with the official SDK: two streamed calls, one upstream connection."""
    import types

    from tests.proxy_fixtures import make_proxy

    server = late_end_server(0.05)
    px, serve = make_proxy(types.SimpleNamespace(url=f"http://127.0.0.1:{server.port}"), tmp_path)
    try:
        client = px.client(px.register("r1"))
        for _ in range(2):
            chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                         stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == "hi"
            time.sleep(0.15)
        assert server.connections == 1
        assert [c.error_class for c in px.calls("r1")] == [None, None]
    finally:
        serve.stop()
        px.store.close()
        server.close()


def test_a_url_that_is_not_http_is_refused_up_front():
    with pytest.raises(ValueError, match="not an http"):
        Upstream("ftp://example.com")
