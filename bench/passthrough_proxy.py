"""A bare pass-through proxy that records nothing: the ceiling ``bench/proxy_overhead.py`` compares against.

Raw ASGI on uvicorn (httptools, uvloop) forwarding every POST to the upstream with one keep-alive aiohttp session;
streams are relayed chunk by chunk. No auth, no parsing, no recording: what any proxy in this position costs.

Usage: python bench/passthrough_proxy.py --upstream http://127.0.0.1:P --port Q
"""

from __future__ import annotations

import argparse

import aiohttp
import uvicorn


def make_app(upstream: str):
    session: aiohttp.ClientSession | None = None

    async def app(scope, receive, send):
        nonlocal session
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    # keep-alive under the upstream's own (uvicorn: 5 s), as the recording proxy's client does: with
                    # aiohttp's 15 s, a connection idle between the bench's phases was reused just as the upstream
                    # closed it, and the reset came back as a 500 that failed the run
                    conn = aiohttp.TCPConnector(limit=1024, keepalive_timeout=3)
                    session = aiohttp.ClientSession(connector=conn, auto_decompress=False)
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await session.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body, more = b"", True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        async with session.request(scope["method"], upstream + scope["path"], data=body or None,
                                   headers={"Content-Type": "application/json"}) as resp:
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", resp.headers.get("content-type", "").encode())]})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvicorn.run(make_app(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port, log_level="warning",
                access_log=False, loop="uvloop", http="httptools")


if __name__ == "__main__":
    main()
