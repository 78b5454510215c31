"""bench/raw_relay.py, the floor bench/proxy_overhead.py measures beside the proxies, on real loopback sockets:
it carries bytes unchanged both ways (more than a socket buffer holds), stops reading a client whose upstream reads
nothing (flow control, not an unbounded buffer), closes the client when the upstream refuses, and closes a late
upstream connection when its client has already gone."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("raw_relay", Path(__file__).parents[1] / "bench" / "raw_relay.py")
relay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(relay)


async def _relay_to(upstream_port: int) -> tuple[asyncio.AbstractServer, int]:
    server = await asyncio.get_running_loop().create_server(relay.serving(upstream_port), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_bytes_cross_unchanged_both_ways_past_the_socket_buffers():
    payload = bytes(range(256)) * 16384   # 4 MiB, each byte value at every offset mod 256

    async def main():
        async def echo(reader, writer):   # answers only once it has read everything: the relay must buffer or pause
            data = await reader.readexactly(len(payload))
            writer.write(data[::-1])
            await writer.drain()
            writer.close()

        upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
        server, port = await _relay_to(upstream.sockets[0].getsockname()[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(payload)
        await writer.drain()
        got = await asyncio.wait_for(reader.read(), 30)   # to EOF: the upstream's close reaches the client
        writer.close()
        server.close()
        upstream.close()
        return got

    assert asyncio.run(main()) == payload[::-1]


def test_a_client_waits_while_its_upstream_reads_nothing():
    async def main():
        stalled = []

        async def never_reads(reader, writer):
            stalled.append(writer)
            await asyncio.sleep(30)

        upstream = await asyncio.start_server(never_reads, "127.0.0.1", 0)
        server, port = await _relay_to(upstream.sockets[0].getsockname()[1])
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"x" * (64 << 20))
        try:   # without flow control the relay reads all 64 MiB into its own buffer and the drain completes
            await asyncio.wait_for(writer.drain(), 2)
            drained = True
        except asyncio.TimeoutError:
            drained = False
        writer.transport.abort()
        server.close()
        upstream.close()
        return drained

    assert asyncio.run(main()) is False


def test_a_refused_upstream_closes_the_client():
    async def main():
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        dead_port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        server, port = await _relay_to(dead_port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        got = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        server.close()
        return got

    assert asyncio.run(main()) == b""


def test_an_upstream_connection_opened_after_its_client_left_is_closed():
    async def main():
        upstream_closed = asyncio.Event()
        release = asyncio.Event()

        async def slow_accept(reader, writer):
            await reader.read()          # EOF: the relay closed its side
            upstream_closed.set()

        upstream = await asyncio.start_server(slow_accept, "127.0.0.1", 0)
        up_port = upstream.sockets[0].getsockname()[1]
        real_open = asyncio.get_running_loop().create_connection

        async def late_open(factory, host, port, **kwargs):   # the relay's upstream connection opens only after
            if port == up_port:                                # its client has gone
                await release.wait()
            return await real_open(factory, host, port, **kwargs)

        asyncio.get_running_loop().create_connection = late_open
        server, port = await _relay_to(up_port)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await asyncio.sleep(0.2)
        release.set()
        await asyncio.wait_for(upstream_closed.wait(), 10)
        server.close()
        upstream.close()

    asyncio.run(main())
