"""Proxy overhead: the same load straight at the upstream double and through the recording proxy.

Three processes on loopback: the scripted upstream (``python -m proxy.engines.scripted.upstream``, answering a short text
after a 20 ms delay), the proxy (``openforge proxy``, recording into a fresh SQLite store through its journal),
and this load generator (aiohttp, one event loop). Each client is one rollout with its own token and cycles
through 8 distinct 8 KB prompts, so every request differs from its rollout's previous one (the proxy prepares,
hashes and journals the whole prompt each time) while the double's tokenizer cache stays warm: a real engine
tokenizes on its own hardware, and on this 2-core machine the double's tokenizer (7 ms per 8 KB) would otherwise
eat the CPU the proxy is measured on. Warm-up sends every prompt once. For concurrency 1, 16 and 64, streaming
and not, it runs a fixed number of requests direct, through a bare pass-through proxy that records nothing
(``bench/passthrough_proxy.py``: uvicorn and aiohttp, an HTTP server and client and nothing else), through a raw TCP
relay (``bench/raw_relay.py``: bytes copied both ways, no HTTP; the extra hop and wake-ups alone, the floor under any
proxy on this event loop) and through the recording proxy, in five interleaved rounds, and compares latency (pooled
percentiles) and throughput (the median round).

Prints a table, then as its LAST line one JSON object with (at least):
  added_p50_ms_c1, added_p50_ms_c16, added_p99_ms_c16: proxied minus direct latency
  throughput_ratio_c64, throughput_ratio_c64_stream: proxied / direct requests per second
  cpu_ms_per_call: CPU time per recorded call of the proxy and its children (its store drain process), all proxied
    runs together
  proxy_own_p50_ms_c1, proxy_own_p50_ms_c16: the proxy's own time per call as it measures it (its
    openforge_proxy_overhead_seconds histogram: request in to answer out, less the wait for the upstream); what
    added_p50 has beyond it is the extra loopback hop and process wake-ups, which the bare pass-through pays too
  relay_added_p50_ms_c1, relay_added_p50_ms_c16, relay_throughput_ratio_c64: the raw relay's figures (the hop alone)
The 2-core machine runs every process (the load, the double, the proxies and the store's writer) at once: ratios
are pessimistic there. The recording proxy asks the upstream for token ids and logprobs (what it exists for); the
direct, bare and relay runs do not, and producing them costs the double itself 0.3-1.0 ms of p50 per streamed call
at 16 clients (direct runs with and without them asked for, three runs), which shows up in the proxied stream
figures as added latency.

``--server uvicorn`` serves the recording proxy's same ASGI app on uvicorn (httptools, uvloop) instead of its own
HTTP server (``proxy._http``, what ``openforge proxy`` runs): the two side by side.

``--protocol responses|messages|gemini`` sends the proxied load through that wire protocol (the proxy translates it
to the same chat request upstream and the answer back) while the direct load stays chat completions: the added
figures are then the translation's cost on top of recording. The bare pass-through and the relay would carry the
same chat load as a ``chat`` run and are left out (their columns read n/a). The default, ``chat``, runs with all four
protocols registered, as ``openforge proxy`` does: its figures are the chat path's with the others beside it.

Usage: python bench/proxy_overhead.py [--quick] [--server own|uvicorn] [--protocol chat|responses|messages|gemini]
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
from pathlib import Path

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.machine import describe  # noqa: E402  (ROOT first on the path)

ADMIN = "bench-admin-token-0123456789"
ROUNDS = 5  # interleaved: this machine's speed drifts over minutes (other tenants), and every target sees the drift
console = Console(stderr=True, width=160)  # the table in a pipe, not cut to 80 columns


# The recording proxy as ``openforge proxy`` builds it, served by uvicorn: ``--server uvicorn``.
UVICORN_PROXY = """
import gc, sys, uvicorn
from forge_store import get_settings
from proxy import build_proxy
proxy = build_proxy(sys.argv[1], settings=get_settings(), store_url=sys.argv[3])
gc.collect()
gc.freeze()  # as openforge proxy does
try:
    uvicorn.run(proxy.app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False,
                loop="uvloop", http="httptools")
finally:
    proxy.store.close()
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} did not come up at {url}")


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and its living descendants (the proxy's store drain process is a child)."""
    total = 0.0
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                total += sum(cpu_seconds(int(child)) for child in fh.read().split())
    except FileNotFoundError:
        pass
    return total


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


PROTOCOLS = ("chat", "responses", "messages", "gemini")


def request(protocol: str, prompt: str, stream: bool, token: str) -> tuple[str, dict, dict]:
    """One request of ``protocol`` asking the same as the chat one: (path, body, headers)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if protocol == "responses":
        return "/v1/responses", {"model": "m", "max_output_tokens": 16, "stream": stream, "input": prompt}, headers
    if protocol == "messages":
        return "/v1/messages", {"model": "m", "max_tokens": 16, "stream": stream,
                                "messages": [{"role": "user", "content": prompt}]}, headers
    if protocol == "gemini":
        path = "/v1beta/models/m:" + ("streamGenerateContent?alt=sse" if stream else "generateContent")
        return path, {"contents": [{"role": "user", "parts": [{"text": prompt}]}],
                      "generationConfig": {"maxOutputTokens": 16}}, {"x-goog-api-key": token,
                                                                     "Content-Type": "application/json"}
    return "/v1/chat/completions", {"model": "m", "max_tokens": 16, "stream": stream,
                                    "messages": [{"role": "user", "content": prompt}]}, headers


async def run_load(base: str, tokens: list[str], concurrency: int, n: int, stream: bool, protocol: str = "chat") -> dict:
    """``n`` requests from ``concurrency`` clients; returns latencies (ms) and requests/s."""
    latencies: list[float] = []
    filler = "lorem ipsum dolor sit amet " * 300  # ~8 KB
    prompts = [[f"client {k}, variant {v}: {filler}" for v in range(8)] for k in range(concurrency)]
    counter = iter(range(8 * concurrency))  # warm-up: every prompt once

    async def client(k: int, session: aiohttp.ClientSession):
        for i in counter:
            path, body, headers = request(protocol, prompts[k][i % 8], stream, tokens[k])
            t0 = time.perf_counter()
            async with session.post(base + path, json=body, headers=headers) as resp:
                if stream:
                    async for _ in resp.content:
                        pass
                else:
                    await resp.read()
                assert resp.status == 200, f"{base} answered {resp.status}: {(await resp.read())[:500]!r}"
            latencies.append((time.perf_counter() - t0) * 1000)

    conn = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=conn) as session:
        await asyncio.gather(*(client(k, session) for k in range(concurrency)))
        counter = iter(range(n))
        t0 = time.perf_counter()
        latencies.clear()
        await asyncio.gather(*(client(k, session) for k in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {"latencies": list(latencies), "rps": n / elapsed, "n": n}


def overhead_buckets(base: str) -> dict[float, float]:
    """The proxy's ``openforge_proxy_overhead_seconds`` histogram: cumulative count per upper bound (seconds)."""
    return {float(s.labels["le"]): s.value  # float() reads "+Inf"
            for family in text_string_to_metric_families(httpx.get(base + "/metrics").text)
            for s in family.samples if s.name == "openforge_proxy_overhead_seconds_bucket"}


def bucket_median_ms(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The median of the observations made between two snapshots, interpolated within its bucket."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    half, lower, below = counts[-1] / 2, 0.0, 0.0
    for bound, cum in zip(bounds, counts):
        if cum >= half:
            if bound == float("inf"):
                return lower * 1000
            return (lower + (bound - lower) * (half - below) / max(cum - below, 1e-9)) * 1000
        lower, below = bound, cum
    return None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def pooled(rounds: list[dict]) -> dict:
    """Rounds of one target pooled: percentiles over every latency, the median round's requests/s."""
    latencies = [x for r in rounds for x in r["latencies"]]
    return {"p50": statistics.median(latencies), "p99": percentile(latencies, 0.99),
            "rps": statistics.median(r["rps"] for r in rounds), "n": len(latencies)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer requests per configuration")
    ap.add_argument("--server", choices=("own", "uvicorn"), default="own",
                    help="what serves the recording proxy: its own HTTP server (openforge proxy) or uvicorn")
    ap.add_argument("--protocol", choices=PROTOCOLS, default="chat",
                    help="the wire protocol of the proxied load (the direct load is chat completions)")
    args = ap.parse_args()
    machine = describe()   # before the load: its load average is the neighbours'
    with_bare = args.protocol == "chat"   # the bare pass-through forwards chat completions only
    sizes = {1: 250, 16: 800, 64: 1600} if not args.quick else {1: 50, 16: 200, 64: 400}

    tmp = Path(tempfile.mkdtemp(prefix="of-bench-proxy-"))
    up_port, px_port, pt_port, rl_port = free_port(), free_port(), free_port(), free_port()
    env = {**os.environ, "OPENFORGE_HOME": str(tmp / "home"), "OPENFORGE_PROXY_ADMIN_TOKEN": ADMIN,
           "PYTHONPATH": str(ROOT)}
    upstream = subprocess.Popen([sys.executable, "-m", "proxy.engines.scripted.upstream", "--port", str(up_port)],
                                env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "upstream.log", "wb"), cwd=ROOT)
    store = f"sqlite:///{tmp / 'store.sqlite'}"
    command = ([str(Path(sys.executable).parent / "openforge"), "proxy", "--upstream", f"http://127.0.0.1:{up_port}",
                "--port", str(px_port), "--store", store] if args.server == "own"
               else [sys.executable, "-c", UVICORN_PROXY, f"http://127.0.0.1:{up_port}", str(px_port), store])
    proxy = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "proxy.log", "wb"), cwd=ROOT)
    passthrough = subprocess.Popen([sys.executable, str(ROOT / "bench" / "passthrough_proxy.py"), "--upstream",
                                    f"http://127.0.0.1:{up_port}", "--port", str(pt_port)],
                                   env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "bare.log", "wb"), cwd=ROOT)
    relay_proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "raw_relay.py"), "--upstream-port",
                                   str(up_port), "--port", str(rl_port)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "relay.log", "wb"), cwd=ROOT)
    direct, proxied = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{px_port}"
    bare, relay = f"http://127.0.0.1:{pt_port}", f"http://127.0.0.1:{rl_port}"
    try:
        wait_up(direct + "/health", upstream, "upstream double")
        wait_up(proxied + "/health", proxy, "proxy")
        wait_up(bare + "/health", passthrough, "pass-through proxy")
        wait_up(relay + "/health", relay_proc, "raw relay")
        httpx.post(direct + "/_scripted/script", json={"replace": True, "steps": [
            {"delay": 0.020, "times": None, "then": {"text": "Sure, done.", "times": None}}]})
        admin = {"Authorization": f"Bearer {ADMIN}"}
        tokens = [httpx.post(proxied + "/admin/rollouts", json={"rollout_id": f"bench-{k}"}, headers=admin).json()["token"]
                  for k in range(64)]
        results, cpu, bare_cpu, recorded = {}, 0.0, 0.0, 0
        for stream in (False, True):
            for c, n in sizes.items():
                label = f"c{c}{'_stream' if stream else ''}"
                console.print(f"[dim]{label}: {ROUNDS} rounds of {n // ROUNDS} requests direct"
                              f"{', bare, relay' if with_bare else ''}, proxied ({args.protocol})[/]")
                rounds = {"direct": [], "bare": [], "relay": [], "proxied": []}
                own_before = overhead_buckets(proxied)
                for _ in range(ROUNDS):  # interleaved, so that drift in the machine's speed hits every target alike
                    rounds["direct"].append(asyncio.run(run_load(direct, tokens, c, n // ROUNDS, stream)))
                    b0 = cpu_seconds(passthrough.pid)
                    rounds["bare"].append(asyncio.run(run_load(bare, tokens, c, n // ROUNDS, stream))
                                          if with_bare else None)
                    bare_cpu += cpu_seconds(passthrough.pid) - b0
                    rounds["relay"].append(asyncio.run(run_load(relay, tokens, c, n // ROUNDS, stream))
                                           if with_bare else None)
                    c0 = cpu_seconds(proxy.pid)
                    rounds["proxied"].append(asyncio.run(run_load(proxied, tokens, c, n // ROUNDS, stream,
                                                                  args.protocol)))
                    cpu += cpu_seconds(proxy.pid) - c0
                    recorded += n // ROUNDS + 8 * c
                results[label] = {target: pooled(r) if None not in r else None for target, r in rounds.items()}
                results[label]["own_p50_ms"] = bucket_median_ms(own_before, overhead_buckets(proxied))
        stored = httpx.get(proxied + "/health").json()["store"]
    finally:
        for proc in (proxy, passthrough, relay_proc, upstream):
            proc.terminate()
        for proc in (proxy, passthrough, relay_proc, upstream):
            proc.wait(30)

    table = Table(title="recording proxy vs direct (ms, requests/s)")
    for col in ("load", "direct p50", "added p50", "bare added p50", "relay added p50", "direct p99", "added p99",
                "bare added p99", "direct rps", "proxied rps", "ratio", "bare ratio", "relay ratio"):
        table.add_column(col, justify="right")
    for label, r in results.items():
        d, p = r["direct"], r["proxied"]
        none = {"p50": float("nan"), "p99": float("nan"), "rps": float("nan")}   # nan: shown as n/a
        b, rl = r["bare"] or none, r["relay"] or none
        row = [f"{d['p50']:.2f}", f"{p['p50'] - d['p50']:.2f}", f"{b['p50'] - d['p50']:.2f}",
               f"{rl['p50'] - d['p50']:.2f}", f"{d['p99']:.2f}", f"{p['p99'] - d['p99']:.2f}",
               f"{b['p99'] - d['p99']:.2f}", f"{d['rps']:.0f}", f"{p['rps']:.0f}", f"{p['rps'] / d['rps']:.2f}",
               f"{b['rps'] / d['rps']:.2f}", f"{rl['rps'] / d['rps']:.2f}"]
        table.add_row(label, *[cell.replace("nan", "n/a") for cell in row])
    console.print(table)

    def added(label, q):
        return round(results[label]["proxied"][q] - results[label]["direct"][q], 3)

    def beside_added(label, q, target):   # the bare pass-through's or the relay's; None where it did not run
        b = results[label][target]
        return round(b[q] - results[label]["direct"][q], 3) if b else None

    def beside_ratio(label, target):
        b = results[label][target]
        return round(b["rps"] / results[label]["direct"]["rps"], 3) if b else None

    out = {
        "added_p50_ms_c1": added("c1", "p50"),
        "added_p50_ms_c16": added("c16", "p50"),
        "added_p99_ms_c16": added("c16", "p99"),
        "added_p50_ms_c1_stream": added("c1_stream", "p50"),
        "added_p50_ms_c16_stream": added("c16_stream", "p50"),
        "added_p99_ms_c16_stream": added("c16_stream", "p99"),
        "throughput_ratio_c64": round(results["c64"]["proxied"]["rps"] / results["c64"]["direct"]["rps"], 3),
        "throughput_ratio_c64_stream": round(results["c64_stream"]["proxied"]["rps"]
                                             / results["c64_stream"]["direct"]["rps"], 3),
        "direct_rps_c64": round(results["c64"]["direct"]["rps"], 1),
        "proxied_rps_c64": round(results["c64"]["proxied"]["rps"], 1),
        "bare_added_p50_ms_c1": beside_added("c1", "p50", "bare"),   # None with --protocol other than chat
        "bare_added_p50_ms_c16": beside_added("c16", "p50", "bare"),
        "bare_added_p50_ms_c16_stream": beside_added("c16_stream", "p50", "bare"),
        "bare_throughput_ratio_c64": beside_ratio("c64", "bare"),
        "bare_throughput_ratio_c64_stream": beside_ratio("c64_stream", "bare"),
        "relay_added_p50_ms_c1": beside_added("c1", "p50", "relay"),   # the hop alone
        "relay_added_p50_ms_c16": beside_added("c16", "p50", "relay"),
        "relay_throughput_ratio_c64": beside_ratio("c64", "relay"),
        # the proxy's own time per call, measured inside it (request in to answer out, less the upstream's share);
        # the rest of added_p50 is the extra loopback hop and process wake-ups, which the bare pass-through pays too
        "proxy_own_p50_ms_c1": _round(results["c1"]["own_p50_ms"]),  # None against a proxy without the metric
        "proxy_own_p50_ms_c16": _round(results["c16"]["own_p50_ms"]),
        "cpu_ms_per_call": round(cpu * 1000 / recorded, 3),
        "bare_cpu_ms_per_call": round(bare_cpu * 1000 / recorded, 3) if with_bare else None,
        "store_dead_letters": stored.get("dead_letters"),
        "server": args.server,
        "protocol": args.protocol,
        "machine": machine,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
