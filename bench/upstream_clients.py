"""Upstream HTTP client benchmark: which async client should the recording proxy forward with?

The proxy's hot path: harness call in -> forward the (already serialized) body to the OpenAI-compatible
inference server -> read the answer (whole JSON, or SSE lines as they arrive) -> answer and record it.
The upstream client runs inside the proxy's one uvicorn/uvloop process, so its CPU per request is taken
from the event loop that also serves the harness; that cost, and the latency it adds under
concurrency, is what this measures.

Load: ~8 KB chat prompt (pre-encoded bytes, as a proxy forwards them), max_tokens 16, a short scripted
answer after a fixed 20 ms upstream delay (a `Delay` step scripted into `ScriptedUpstream`, served in a
SEPARATE process by `python -m proxy.engines.scripted.upstream --port P`, so client and server share no GIL).
Each client is used as a proxy would: one long-lived client per cell, keep-alive, pool sized for the
concurrency. Variants: httpx-default (AsyncClient(): 20 keep-alive connections), httpx-sized
(http2=False, Limits sized), httpx-raw (httpx-sized, SSE split from aiter_raw instead of aiter_lines;
its json cells repeat httpx-sized's: a noise floor), httpx2-sized (pydantic's httpx fork, used by newer
openai/anthropic SDKs, if installed), aiohttp (TCPConnector(limit=c), `async for line in resp.content`),
aiohttp-nodecomp (auto_decompress=False), httpcore (AsyncConnectionPool, sized), openforge (the proxy's own client,
``proxy._upstream.Upstream``: asyncio protocols and httptools, SSE events in batches). Modes: json (read the
whole body, orjson.loads) and stream (stream: true, count `data:` lines as they arrive). Concurrency
1, 16, 64 (asyncio tasks in this process, uvloop if installed); each cell warms the pool, then runs
`--seconds` of closed-loop load, and reports p50/p99 latency, requests/s and client CPU ms/request
(time.process_time delta / requests; the upstream's CPU is in its own process).

"chosen": at c64, keep the variants whose p50 and p99 are within 15% of the best variant's in both
modes, and pick the lowest mean (json, stream) CPU ms/request among them (all variants if none pass).
On a 2-core machine the upstream double saturates first at c64, so c64 latency is partly server
queueing; CPU/request is the figure that transfers to the real proxy.

Progress goes to stderr (rich); the LAST stdout line is one JSON object with every figure.
Usage: python bench/upstream_clients.py [--quick] [--seconds 2.5] [--variants aiohttp,httpx-sized]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import httpcore
import httpx
import orjson
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
PATH = "/v1/chat/completions"
HEADERS = {"content-type": "application/json", "authorization": "Bearer bench"}
ANSWER = "Done: the failing test passes now."
VARIANTS = ["httpx-default", "httpx-sized", "httpx-raw", "aiohttp", "aiohttp-nodecomp", "httpcore", "openforge"]
try:  # pydantic's httpx fork (what newer openai/anthropic SDKs use), if installed: same API as httpx
    import httpx2
    VARIANTS.insert(3, "httpx2-sized")
except ImportError:
    httpx2 = None
console = Console(stderr=True, width=110)


def prompt_body(stream: bool, size: int = 8192) -> bytes:
    words = " ".join(f"tok{i % 997}" for i in range(size // 4))[: size - 200]
    messages = [{"role": "system", "content": "You are a coding agent. Use the tools."},
                {"role": "user", "content": words}]
    return orjson.dumps({"model": "policy", "messages": messages, "max_tokens": 16, "temperature": 1.0,
                         "stream": stream})


async def count_data_lines(chunks) -> int:
    """Split raw SSE bytes into lines as they arrive, as a proxy parsing events would; count `data:` lines."""
    buf, n = bytearray(), 0
    async for chunk in chunks:
        buf += chunk
        start = 0
        while (i := buf.find(b"\n", start)) >= 0:
            n, start = n + buf.startswith(b"data:", start), i + 1
        del buf[:start]
    return n


class Client:
    """One long-lived client of a variant; `call(body, stream)` returns a count to check the answer."""

    def __init__(self, variant: str, base: str, conc: int) -> None:
        self.variant, self.url, timeout = variant, base + PATH, 60.0
        if variant == "httpx-default":
            self.c = httpx.AsyncClient(base_url=base, timeout=timeout)
        elif variant in ("httpx-sized", "httpx-raw", "httpx2-sized"):
            mod = httpx2 if variant == "httpx2-sized" else httpx
            limits = mod.Limits(max_connections=conc, max_keepalive_connections=conc)
            self.c = mod.AsyncClient(base_url=base, http2=False, limits=limits, timeout=timeout)
        elif variant.startswith("aiohttp"):
            self.c = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=conc), timeout=aiohttp.ClientTimeout(total=timeout),
                auto_decompress=variant != "aiohttp-nodecomp")
        elif variant == "openforge":  # the proxy's own client (proxy._upstream: asyncio protocols + httptools)
            from proxy._upstream import Upstream

            self.c = Upstream(base, read_timeout_s=timeout, pool=conc)
        elif variant == "httpcore":
            self.c = httpcore.AsyncConnectionPool(max_connections=conc, max_keepalive_connections=conc)
            self.hc_headers = [(k.encode(), v.encode()) for k, v in HEADERS.items()]
        else:
            raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")

    async def call(self, body: bytes, stream: bool) -> int:
        v = self.variant
        if v.startswith("httpx"):
            if not stream:
                r = await self.c.post(PATH, content=body, headers=HEADERS)
                r.raise_for_status()
                return len(orjson.loads(r.content)["choices"])
            async with self.c.stream("POST", PATH, content=body, headers=HEADERS) as r:
                r.raise_for_status()
                if v == "httpx-raw":
                    return await count_data_lines(r.aiter_raw())
                return sum([1 async for line in r.aiter_lines() if line.startswith("data:")])
        if v.startswith("aiohttp"):
            async with self.c.post(self.url, data=body, headers=HEADERS) as r:
                r.raise_for_status()
                if not stream:
                    return len(orjson.loads(await r.read())["choices"])
                return sum([1 async for line in r.content if line.startswith(b"data:")])
        if v == "openforge":
            if not stream:
                ans = await self.c.request("POST", PATH, body)
                if ans.status != 200:
                    raise RuntimeError(f"HTTP {ans.status}")
                return len(orjson.loads(ans.body)["choices"])
            answer = await self.c.open_stream(PATH, body)
            try:
                if answer.status != 200:
                    raise RuntimeError(f"HTTP {answer.status}")
                return sum([1 async for events in answer.batches() for e in events if e.startswith(b"data:")])
            finally:
                answer.close()
        async with self.c.stream("POST", self.url, headers=self.hc_headers, content=body) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}")
            if not stream:
                return len(orjson.loads(await r.aread())["choices"])
            return await count_data_lines(r.aiter_stream())

    async def aclose(self) -> None:
        await (self.c.close() if self.variant.startswith("aiohttp") or self.variant == "openforge" else self.c.aclose())


async def run_cell(variant: str, base: str, stream: bool, conc: int, seconds: float, max_req: int) -> dict:
    body = prompt_body(stream)
    client = Client(variant, base, conc)
    lat: list[float] = []
    errors, budget, first_error = 0, [max_req], [""]
    try:
        await asyncio.gather(*(client.call(body, stream) for _ in range(conc)))  # warm-up: open the pool
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal errors
            while budget[0] > 0 and time.perf_counter() < deadline:
                budget[0] -= 1
                t = time.perf_counter()
                try:
                    ok = await client.call(body, stream) >= 1
                except Exception as e:  # noqa: BLE001 - counted and reported, the cell goes on
                    ok, first_error[0] = False, first_error[0] or repr(e)[:160]
                if ok:
                    lat.append(time.perf_counter() - t)
                errors += not ok

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    finally:
        await client.aclose()
    n = len(lat)
    q = statistics.quantiles(lat, n=100, method="inclusive") if n > 1 else (lat or [float("nan")]) * 99
    return {"variant": variant, "mode": "stream" if stream else "json", "concurrency": conc, "requests": n,
            "errors": errors, "p50_ms": round(q[49] * 1e3, 2), "p99_ms": round(q[98] * 1e3, 2),
            "rps": round(n / wall, 1), "cpu_ms_per_req": round(cpu * 1e3 / max(n, 1), 3), "first_error": first_error[0]}


def choose(cells: list[dict], conc: int) -> tuple[str, str]:
    at = [c for c in cells if c["concurrency"] == conc and c["requests"]]
    variants = sorted({c["variant"] for c in at})
    fig = {(c["variant"], c["mode"]): c for c in at}
    best = {(m, k): min(c[k] for c in at if c["mode"] == m) for m in ("json", "stream") for k in ("p50_ms", "p99_ms")}

    def ok(v: str) -> bool:
        return all((v, m) in fig and fig[v, m][k] <= 1.15 * best[m, k] for (m, k) in best)

    def cpu(v: str) -> float:
        return statistics.mean(fig[v, m]["cpu_ms_per_req"] for m in ("json", "stream") if (v, m) in fig)

    gated = [v for v in variants if ok(v)]
    pick = min(gated or variants, key=cpu)
    rule = (f"c{conc}: among variants with p50 and p99 within 15% of the best in both modes ({', '.join(gated) or 'none'}"
            "), lowest mean CPU ms/request over json+stream" + ("" if gated else "; none passed, so lowest CPU overall"))
    return pick, rule


def _reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
        return True
    except OSError:
        return False


def start_upstream(delay: float) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "proxy.engines.scripted.upstream", "--port", str(port)], cwd=ROOT)
    base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
    while not _reachable(base + "/health"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the upstream double did not start (its stderr is above).")
        time.sleep(0.2)
    script = {"replace": True, "steps": [{"delay": delay, "times": None, "then": {"text": ANSWER, "times": None}}]}
    req = urllib.request.Request(base + "/_scripted/script", data=json.dumps(script).encode(), headers=HEADERS)
    urllib.request.urlopen(req, timeout=5).close()
    return proc, base


async def bench(args: argparse.Namespace, base: str) -> list[dict]:
    variants = args.variants.split(",")
    plan = [(v, s, c) for v in variants for s in (False, True) for c in args.concurrency]
    cells: list[dict] = []
    with Progress(console=console, transient=False) as progress:
        task = progress.add_task("cells", total=len(plan))
        for v, s, c in plan:
            progress.update(task, description=f"{v:16} {'stream' if s else 'json':6} c{c:<3}")
            cell = await run_cell(v, base, s, c, args.seconds, args.max_requests)
            cells.append(cell)
            progress.console.log(" ".join(f"{k}={val}" for k, val in cell.items()))
            progress.advance(task)
    return cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="0.7 s per cell instead of --seconds")
    ap.add_argument("--seconds", type=float, default=2.5, help="timed load per cell")
    ap.add_argument("--max-requests", type=int, default=20_000, help="cap per cell")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--delay", type=float, default=0.020, help="upstream delay before the answer (s)")
    args = ap.parse_args()
    if args.quick:
        args.seconds = 0.7
    try:
        import uvloop
        runner, loop_name = uvloop.run, "uvloop"
    except ImportError:
        runner, loop_name = asyncio.run, "asyncio"
    proc, base = start_upstream(args.delay)
    t0 = time.perf_counter()
    try:
        cells = runner(bench(args, base))
    finally:
        proc.terminate()
        proc.wait(10)
    table = Table(title=f"upstream clients ({loop_name}, {args.delay * 1e3:.0f} ms upstream delay, 8 KB prompt)")
    for col in ("variant", "mode", "conc", "reqs", "err", "p50 ms", "p99 ms", "req/s", "cpu ms/req"):
        table.add_column(col, justify="left" if col in ("variant", "mode") else "right")
    for c in cells:
        table.add_row(*(str(x) for x in list(c.values())[:9]))
    console.print(table)
    chosen, rule = choose(cells, max(args.concurrency))
    console.print(f"chosen: [bold]{chosen}[/] ({rule})")
    versions = {"httpx": httpx.__version__, "aiohttp": aiohttp.__version__, "httpcore": httpcore.__version__,
                "httpx2": getattr(httpx2, "__version__", None), "python": sys.version.split()[0], "cpus": os.cpu_count()}
    print(json.dumps({"chosen": chosen, "rule": rule, "loop": loop_name, "delay_s": args.delay,
                      "seconds_per_cell": args.seconds, "total_s": round(time.perf_counter() - t0, 1),
                      "versions": versions, "cells": cells}))


if __name__ == "__main__":
    main()
