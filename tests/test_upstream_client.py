"""The proxy's own upstream HTTP client (``proxy.upstream``) against real servers on loopback: TLS, connection
reuse, a pooled connection the server closed, bodies ended by the connection, and answers cut short."""

from __future__ import annotations

import asyncio
import subprocess
import threading

import orjson
import pytest
import uvicorn

from proxy.errors import UpstreamFailure
from proxy.testing import ScriptedUpstream, Text
from proxy.upstream import Upstream
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

    from proxy import upstream as upstream_module

    wakes = []
    real_wake = upstream_module._Connection._wake
    monkeypatch.setattr(upstream_module._Connection, "_wake",
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


def test_a_url_that_is_not_http_is_refused_up_front():
    with pytest.raises(ValueError, match="not an http"):
        Upstream("ftp://example.com")
