"""Routing over engine replicas: one recording proxy (``openforge proxy --upstream ... --upstream ...``) in front of
1, 2 and 4 engine doubles, 64 concurrent rollouts.

What the doubles simulate (``proxy.engines.scripted.EngineReplicas``, ``ScriptedUpstream.set_capacity``): an engine with a
batch limit. Each handles at most ``--capacity`` requests at once, each spending ``--slow`` seconds in it (prefill and
decode, as one wait), and queues the rest, as requests past vLLM's ``max_num_seqs`` wait in its scheduler; one
replica so serves at most capacity / slow calls a second, and more replicas should raise throughput until the proxy
(or this 2-core machine, which runs the doubles, the proxy and the load together) is the limit.

Each client is one rollout: registered through the admin API, then ``--calls`` chat calls in turn, each prompt the
previous one plus the answer and a new user turn (what a prefix cache rewards affinity for). Per configuration it
prints calls/s, p50 / p99 latency, the calls each replica received (from the doubles' own request logs) and the
rollout affinity (share of rollouts whose calls, as the store recorded them, all went to one replica).

Prints a table, then as its LAST line one JSON object: per upstream count n, ``calls_per_s_n``, ``p50_ms_n``,
``p99_ms_n``, ``spread_n`` (max |calls - mean| / mean over replicas), ``affinity_n``; and ``speedup_4`` (calls/s
with 4 replicas over 1). Usage: python bench/proxy_routing.py [--slow 0.1] [--capacity 4] [--calls 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import aiohttp
import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.doubles.engine_replicas import EngineReplicas  # noqa: E402

ADMIN = "bench-admin-token-0123456789"
CLIENTS = 64
console = Console(stderr=True)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def load(base: str, tokens: list[str], calls: int) -> dict:
    latencies: list[float] = []

    async def client(token: str, session: aiohttp.ClientSession) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        messages = [{"role": "user", "content": f"task for {token[-12:]}: " + "context " * 200}]
        for turn in range(calls):
            t0 = time.perf_counter()
            async with session.post(base + "/v1/chat/completions", headers=headers,
                                    json={"model": "m", "max_tokens": 16, "messages": messages}) as resp:
                body = await resp.json()
                assert resp.status == 200, body
            latencies.append((time.perf_counter() - t0) * 1000)
            messages += [body["choices"][0]["message"], {"role": "user", "content": f"observation {turn}"}]

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CLIENTS * 2)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(t, session) for t in tokens))
        elapsed = time.perf_counter() - t0
    return {"calls_per_s": len(latencies) / elapsed, "p50_ms": statistics.median(latencies),
            "p99_ms": percentile(latencies, 0.99), "n": len(latencies)}


def wait_up(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the proxy exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the proxy did not come up at {url}")


def run(n: int, engines: EngineReplicas, calls: int, tmp: Path) -> dict:
    urls = engines.urls[:n]
    before = engines.calls()
    port, store = free_port(), f"sqlite:///{tmp / f'store-{n}.sqlite'}"
    env = {**os.environ, "OPENFORGE_HOME": str(tmp / f"home-{n}"), "OPENFORGE_PROXY_ADMIN_TOKEN": ADMIN,
           "PYTHONPATH": str(ROOT)}
    cmd = [str(Path(sys.executable).parent / "openforge"), "proxy", "--port", str(port), "--store", store]
    for u in urls:
        cmd += ["--upstream", u]
    proxy = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / f"proxy-{n}.log", "wb"))
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(base + "/health", proxy)
        admin = {"Authorization": f"Bearer {ADMIN}"}
        tokens = [httpx.post(base + "/admin/rollouts", json={"rollout_id": f"n{n}-r{k}"}, headers=admin).json()["token"]
                  for k in range(CLIENTS)]
        result = asyncio.run(load(base, tokens, calls))
        listing = httpx.get(base + "/admin/upstreams", headers=admin).json()["upstreams"]
    finally:
        proxy.terminate()
        proxy.wait(30)
    after = engines.calls()
    got = [after[i] - before.get(i, 0) for i in range(n)]
    mean = sum(got) / n
    result["per_replica"] = got
    result["spread"] = max(abs(g - mean) / mean for g in got)
    result["states"] = [u["state"] for u in listing]
    result["affinity"] = affinity(store, n) if n > 1 else 1.0
    return result


def affinity(store_url: str, n: int) -> float:
    """Share of rollouts whose recorded calls all name one replica."""
    from forge_store import open_store

    st = open_store(store_url)
    try:
        where = defaultdict(set)
        for k in range(CLIENTS):
            for c in st.calls(f"n{n}-r{k}"):
                where[c.rollout_id].add((c.metadata or {}).get("upstream"))
    finally:
        st.close()
    return sum(1 for s in where.values() if len(s) == 1) / max(len(where), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slow", type=float, default=0.1, help="seconds a call spends in an engine")
    ap.add_argument("--capacity", type=int, default=4, help="calls an engine handles at once")
    ap.add_argument("--calls", type=int, default=6, help="calls per rollout")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="of-bench-routing-"))
    results = {}
    with EngineReplicas(4, slow=args.slow, capacity=args.capacity) as engines:
        for n in (1, 2, 4):
            console.print(f"[dim]{n} upstream(s): {CLIENTS} rollouts x {args.calls} calls[/]")
            results[n] = run(n, engines, args.calls, tmp)
    table = Table(title=f"one proxy, 64 rollouts; engines: {args.capacity} at once, {args.slow * 1000:.0f} ms each")
    for col in ("upstreams", "calls/s", "p50 ms", "p99 ms", "calls per replica", "spread", "affinity"):
        table.add_column(col, justify="right")
    for n, r in results.items():
        table.add_row(str(n), f"{r['calls_per_s']:.1f}", f"{r['p50_ms']:.0f}", f"{r['p99_ms']:.0f}",
                      " ".join(map(str, r["per_replica"])), f"{r['spread']:.1%}", f"{r['affinity']:.0%}")
    console.print(table)
    out = {"slow_s": args.slow, "capacity": args.capacity, "clients": CLIENTS, "calls_per_rollout": args.calls,
           "engine_ceiling_calls_per_s_per_replica": args.capacity / args.slow}
    for n, r in results.items():
        out.update({f"calls_per_s_{n}": round(r["calls_per_s"], 1), f"p50_ms_{n}": round(r["p50_ms"], 1),
                    f"p99_ms_{n}": round(r["p99_ms"], 1), f"spread_{n}": round(r["spread"], 3),
                    f"affinity_{n}": r["affinity"], f"per_replica_{n}": r["per_replica"]})
    out["speedup_4"] = round(results[4]["calls_per_s"] / results[1]["calls_per_s"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
