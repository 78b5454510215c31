"""Ingest benchmark: synthetic 50-turn agent rollouts into SQLite and PostgreSQL, durably, through the journal.

Each rollout grows its prompt turn by turn to about 100 KB (tool observations, assistant actions, a screenshot as a
base64 data URL every 10th turn) with prompt token ids growing alongside (the previous prompt + completion, then
the new observation's tokens), completion ids and logprobs per call. Calls are recorded the way the proxy records
them: images moved to the blob store, then ``record_call`` from several threads (one per concurrent rollout); the
clock stops when ``flush()`` confirms every call is in the database.

Prints progress, then as its LAST line one JSON object:
  calls_per_s_sqlite, calls_per_s_postgres: durable calls per second (record -> committed in the database)
  stored_bytes_per_call: (database growth + blob folder growth) / calls, measured on SQLite
  naive_bytes_per_call: bytes if every prompt were stored in full (request JSON + token ids + logprobs)
  storage_ratio: stored / naive

Usage: python bench/store_ingest.py [--rollouts 40] [--turns 50] [--threads 16] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from array import array
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import sqlalchemy as sa
from rich.progress import Progress

from forge_store import CallRecord, Settings, canonical_json, open_store
from forge_store._images import extract_images

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.machine import describe  # noqa: E402  (the repository root first on the path)


def rollout_calls(rid: str, turns: int, seed: int):
    """Yield (CallRecord, naive_bytes) for one synthetic rollout; prompts grow to ~100 KB."""
    rng = random.Random(seed)
    import base64

    words = [f"w{rng.randrange(10_000)}" for _ in range(4000)]
    tools = [{"type": "function", "function": {"name": n, "description": f"{n} tool " * 40,
                                               "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}
             for n in ("shell", "read_file", "write_file", "search")]
    messages = [{"role": "system", "content": "You are an agent. " * 60},
                {"role": "user", "content": "Task: fix the failing test in the repository. " * 5}]
    prompt_ids = [rng.randrange(50_000) for _ in range(400)]
    for turn in range(turns):
        completion = [rng.randrange(50_000) for _ in range(rng.randrange(40, 120))]
        call = CallRecord(
            id=f"{rid}-{turn}", rollout_id=rid, seq=turn, api_surface="chat.completions", messages=list(messages),
            tools=tools, params={"model": "policy", "temperature": 1.0, "max_tokens": 512},
            started_at=datetime.now(timezone.utc), streamed=True, prompt_token_ids=array("I", prompt_ids),
            completion_token_ids=completion, completion_logprobs=[-rng.random() for _ in completion],
            response={"text": None, "tool_calls": [{"name": "shell", "arguments": '{"cmd": "pytest -x"}'}]},
            finish_reason="tool_calls", token_exact=True, policy_version_id="p0",
            usage={"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion)},
        )
        naive = len(canonical_json({"messages": messages, "tools": tools, **call.params})) + 4 * (
            len(prompt_ids) + 2 * len(completion))
        yield call, naive
        action = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{turn}", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "pytest -x"}'}}]}
        observation = " ".join(rng.choices(words, k=300))
        if turn % 10 == 9:
            shot = rng.randbytes(24_000)  # incompressible, like a PNG

            content = [{"type": "text", "text": observation[:200]},
                       {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(shot).decode()}}]
            messages += [action, {"role": "tool", "tool_call_id": f"call_{turn}", "content": "screenshot taken"},
                         {"role": "user", "content": content}]
        else:
            messages += [action, {"role": "tool", "tool_call_id": f"call_{turn}", "content": observation}]
        prompt_ids = prompt_ids + completion + [rng.randrange(50_000) for _ in range(len(observation) // 4)]


def generate(rollouts: int, turns: int) -> list[list[tuple[CallRecord, int]]]:
    """All rollouts up front (token ids as compact arrays), so the clock measures the store, not the generator."""
    out = []
    with Progress(transient=True) as bar:
        task = bar.add_task(f"generating {rollouts} synthetic rollouts", total=rollouts)
        for r in range(rollouts):
            out.append(list(rollout_calls(f"r{r}", turns, seed=r)))
            bar.advance(task)
    return out


def ingest(url: str, home: Path, data: list, threads: int, label: str) -> dict:
    store = open_store(url, journal=True, settings=Settings(home=home))
    work = list(range(len(data)))
    lock = threading.Lock()
    done = [0]

    def worker():
        while True:
            with lock:
                if not work:
                    return
                r = work.pop()
            rid = f"{label}-{r}"
            store.start_rollout(rid, task_id="bench")
            for call, _ in data[r]:
                call = dataclasses.replace(call, id=f"{rid}-{call.seq}", rollout_id=rid)
                call.messages, call.image_hashes = extract_images(call.messages, store.put_blob)
                store.record_call(call)
                with lock:
                    done[0] += 1
            store.finish_rollout(rid, "success")

    total = sum(len(calls) for calls in data)
    with Progress(transient=True) as bar:
        task = bar.add_task(f"{label}: recording {total} calls", total=total)
        t0 = time.perf_counter()
        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for t in pool:
            t.start()
        while any(t.is_alive() for t in pool):
            time.sleep(0.1)
            bar.update(task, completed=done[0])
        store.flush()
        elapsed = time.perf_counter() - t0
    n_calls = store.counts()["calls"]
    store.close()
    assert n_calls == total, f"{label}: {n_calls} calls stored, expected {total}"
    print(f"{label}: {total} calls in {elapsed:.1f}s = {total / elapsed:.0f} calls/s durable", file=sys.stderr)
    return {"calls": total, "seconds": elapsed}


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=40)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--pg-url", default=os.environ.get("OPENFORGE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = ap.parse_args()
    machine = describe()   # before the load: its load average is the neighbours'

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sqlite_url = f"sqlite:///{tmp / 'bench.sqlite'}"
        with open_store(sqlite_url, settings=Settings(home=tmp / "h0")):
            base_db = (tmp / "bench.sqlite").stat().st_size
        data = generate(args.rollouts, args.turns)
        naive_total = sum(naive for calls in data for _, naive in calls)
        sq = ingest(sqlite_url, tmp / "h1", data, args.threads, "sqlite")
        engine = sa.create_engine(sqlite_url)
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.exec_driver_sql("VACUUM")
        engine.dispose()
        stored = (tmp / "bench.sqlite").stat().st_size - base_db + dir_size(tmp / "h1" / "blobs")

        name = f"of_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(args.pg_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            pg_url = sa.engine.make_url(args.pg_url).set(drivername="postgresql+psycopg", database=name)
            pg = ingest(pg_url.render_as_string(hide_password=False), tmp / "h2", data, args.threads, "postgres")
            with psycopg.connect(pg_url.set(drivername="postgresql").render_as_string(hide_password=False)) as conn:
                pg_bytes = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        finally:
            with psycopg.connect(args.pg_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    calls = sq["calls"]
    result = {
        "rollouts": args.rollouts,
        "turns": args.turns,
        "threads": args.threads,
        "calls_per_s_sqlite": round(sq["calls"] / sq["seconds"], 1),
        "calls_per_s_postgres": round(pg["calls"] / pg["seconds"], 1),
        "stored_bytes_per_call": round(stored / calls),
        "postgres_database_bytes_per_call": round(pg_bytes / calls),
        "naive_bytes_per_call": round(naive_total / calls),
        "storage_ratio": round(stored / naive_total, 4),
        "machine": machine,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
