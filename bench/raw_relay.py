"""A raw TCP relay: each client connection gets its own connection to the upstream, and bytes are copied both ways
as they arrive, with no HTTP parsing, no JSON and no recording (uvloop, TCP_NODELAY, the peer's flow control
passed on). ``bench/proxy_overhead.py`` runs it beside the bare pass-through proxy: what it adds is the extra
loopback hop and the process wake-ups alone, the floor under any proxy written for this event loop on the machine,
where the bare pass-through also pays for an HTTP server and client.

Usage: python bench/raw_relay.py --upstream-port P --port Q
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import uvloop


class Pipe(asyncio.Protocol):
    """One side of a relayed connection: what it reads goes to its peer's transport."""

    def __init__(self, peer: Pipe | None = None):
        self.peer, self.transport, self.early = peer, None, []

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.peer is None or self.peer.transport is None:
            self.early.append(data)   # the client spoke before the upstream connection was open
        else:
            self.peer.transport.write(data)

    def pause_writing(self) -> None:   # the peer's socket is full: stop reading what would go to it
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


def serving(upstream_port: int):
    class Front(Pipe):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.opening = asyncio.get_running_loop().create_task(self._open())  # held: the loop keeps a weak one

        async def _open(self) -> None:
            back = Pipe(self)
            try:
                await asyncio.get_running_loop().create_connection(lambda: back, "127.0.0.1", upstream_port)
            except OSError:
                self.transport.close()
                return
            if self.transport.is_closing():   # the client left while the upstream connection opened
                back.transport.close()
                return
            self.peer = back
            for data in self.early:
                back.transport.write(data)
            self.early.clear()

    return Front


async def main(upstream_port: int, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(serving(upstream_port), "127.0.0.1", port)
    await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream-port", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvloop.run(main(args.upstream_port, args.port))
