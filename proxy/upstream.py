"""The one upstream client: a long-lived aiohttp session with a keep-alive pool.

aiohttp was chosen by measurement over httpx (``bench/upstream_clients.py``): it costs less CPU per request, which
is the proxy's hot path. Connection failures become 502 and silences past the read timeout 504, both recorded as
infrastructure errors; the upstream's own HTTP errors pass through unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from .errors import UpstreamFailure


@dataclass
class UpstreamAnswer:
    status: int
    content_type: str
    body: bytes


class Upstream:
    def __init__(self, base_url: str, *, api_key: str | None = None, connect_timeout_s: float = 5.0,
                 read_timeout_s: float = 600.0, pool: int = 1024):
        base = base_url.rstrip("/")
        self.base_url = base[:-3] if base.endswith("/v1") else base
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s)
        self._pool = pool
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            # Idle connections are dropped before uvicorn's 5 s keep-alive (vLLM's and SGLang's server) closes them.
            connector = aiohttp.TCPConnector(limit=self._pool, limit_per_host=self._pool, keepalive_timeout=3.0)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout,
                                                  auto_decompress=False, headers=self._headers)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _fail(self, exc: BaseException, path: str) -> UpstreamFailure:
        if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
            return UpstreamFailure(504, f"upstream {self.base_url}{path} did not answer within the read timeout; "
                                        "the inference server is overloaded or stuck", "upstream_timeout")
        return UpstreamFailure(502, f"upstream {self.base_url}{path} unreachable ({exc.__class__.__name__}: {exc}); "
                                    "check that the inference server is running", "upstream_unreachable")

    async def _send(self, method: str, path: str, body: bytes | None) -> aiohttp.ClientResponse:
        """Send once; again once if a pooled connection turns out closed before any answer came back."""
        await self.start()
        for attempt in (1, 2):
            try:
                return await self._session.request(method, self.base_url + path, data=body)
            except aiohttp.ServerDisconnectedError as exc:
                if attempt == 2:
                    raise self._fail(exc, path) from exc
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                raise self._fail(exc, path) from exc
        raise AssertionError("unreachable")

    async def request(self, method: str, path: str, body: bytes | None = None) -> UpstreamAnswer:
        resp = await self._send(method, path, body)
        try:
            return UpstreamAnswer(resp.status, resp.content_type, await resp.read())
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise self._fail(exc, path) from exc
        finally:
            resp.release()

    async def open_stream(self, path: str, body: bytes) -> UpstreamStream:
        return UpstreamStream(self, await self._send("POST", path, body), path)


class UpstreamStream:
    """An open streaming answer; iterate SSE events (the bytes between blank lines), then ``close()``."""

    def __init__(self, upstream: Upstream, resp: aiohttp.ClientResponse, path: str):
        self._upstream, self.resp, self._path = upstream, resp, path
        self.status = resp.status
        self.content_type = resp.content_type

    async def read_all(self) -> bytes:
        try:
            return await self.resp.read()
        finally:
            self.close()

    async def events(self) -> AsyncIterator[bytes]:
        """SSE events as they arrive (no buffering beyond one event). UpstreamFailure if the upstream dies."""
        buf = b""
        try:
            async for chunk in self.resp.content.iter_any():
                buf += chunk
                while True:
                    cut = buf.find(b"\n\n")
                    if cut < 0:
                        break
                    event, buf = buf[:cut], buf[cut + 2:]
                    if event.strip():
                        yield event
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise self._upstream._fail(exc, self._path) from exc
        if buf.strip():
            yield buf

    def close(self) -> None:
        self.resp.release()
