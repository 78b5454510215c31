"""Backfill time of migration 0006 (the search index of the calls stored before it) on a large store.

Builds a store of ``--calls`` calls at the head revision without search rows, steps it down to 0005 (the revision
before the search index; 0006's downgrade drops ``call_search`` and its index), then times ``upgrade 0006``: the
table, its trigram index (SQLite FTS5 + triggers, PostgreSQL pg_trgm GIN) and the backfill that reads every call's
new prompt messages and answer and writes its text. Prints one JSON line per backend, e.g.

    python bench/search_backfill.py [--calls 100000] [--sqlite] [--postgres] [--pg-admin URL]

``{"backend": "postgresql", "calls": ..., "build_s": ..., "backfill_s": ..., "calls_per_s": ..., "indexed": ...}``.

PostgreSQL's store is the one ``bench/dashboard_queries.py`` builds (bulk COPY: ~50 calls a rollout, tool results
as delta-encoded prompt messages); SQLite's is built here the same way with executemany (one new tool message and
one answer message per call, each call's prompt a delta on the previous call).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import orjson
import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dashboard_queries import T0, build as build_pg  # noqa: E402
from forge_store import Settings, open_store, sha256_hex  # noqa: E402
from forge_store._migrate import downgrade, upgrade  # noqa: E402


def build_sqlite(url: str, n_calls: int, seed: int = 0) -> dict:
    """Rollouts of 50 calls: each call's prompt adds the previous answer and one tool result (messages stored once,
    content-addressed), its answer a tool call; no search rows (they are what the migration backfills)."""
    rng = random.Random(seed)
    engine = sa.create_engine(url)
    seq, done, r = 0, 0, 0
    with engine.begin() as conn:
        while done < n_calls:
            rid, n = f"r{r:06d}", min(50, n_calls - done)
            start = T0 + timedelta(minutes=r)
            messages, calls, prev, prev_answer = [], [], None, None
            for i in range(n):
                cid = f"{rid}-{i:03d}"
                tool = {"role": "tool", "tool_call_id": f"{cid}-p", "content": f"ok {rid} {i}\n"
                        + ("Traceback (most recent call last):\nValueError: bad\n" if rng.random() < 0.08 else "")
                        + "x" * rng.randint(20, 400)}
                answer = {"role": "assistant", "content": None, "tool_calls": [{"id": f"{cid}-t", "type": "function",
                          "function": {"name": "bash", "arguments": json.dumps({"command": f"ls {rid}/{i}"})}}]}
                tail = []
                for m in ([prev_answer] if prev_answer else []) + [tool]:
                    body = orjson.dumps(m, option=orjson.OPT_SORT_KEYS).decode()
                    h = sha256_hex(body.encode())
                    tail.append(h)
                    if m is tool:
                        seq += 1
                        messages.append({"sha256": h, "role": "tool", "body": body, "size": len(body), "seq": seq})
                abody = orjson.dumps(answer, option=orjson.OPT_SORT_KEYS).decode()
                ahash = sha256_hex(abody.encode())
                seq += 1
                messages.append({"sha256": ahash, "role": "assistant", "body": abody, "size": len(abody), "seq": seq})
                seq += 1
                calls.append({"id": cid, "rollout_id": rid, "seq": i, "base": prev, "tail": json.dumps(tail),
                              "n": 2 * i + 1, "ahash": ahash, "start": start, "ingest_seq": seq})
                prev, prev_answer = cid, answer
            conn.execute(sa.text("INSERT INTO messages (sha256, role, body, size, ingest_seq) VALUES "
                                 "(:sha256, :role, :body, :size, :seq)"), messages)
            conn.execute(sa.text("INSERT INTO calls (id, rollout_id, seq, api_surface, streamed, request_hash, "
                                 "prompt_base_call_id, prompt_base_len, prompt_tail, n_prompt_messages, "
                                 "response_message_hash, finish_reason, prompt_ids_prefix_len, started_at, "
                                 "token_exact, ingest_seq) VALUES (:id, :rollout_id, :seq, 'chat.completions', 0, "
                                 "'0', :base, 0, :tail, :n, :ahash, 'tool_calls', 0, :start, 0, :ingest_seq)"), calls)
            seq += 1
            conn.execute(sa.text("INSERT INTO rollouts (id, task_id, attempt, status, outcome, started_at, ended_at, "
                                 "ingest_seq, finished_seq) VALUES (:id, 'task-0', 1, 'finished', 'success', :s, :s, "
                                 ":q, :q)"), {"id": rid, "s": start, "q": seq})
            done, r = done + n, r + 1
        conn.execute(sa.text("UPDATE ingest_counter SET value = :v WHERE id = 1"), {"v": seq})
    engine.dispose()
    return {"rollouts": r, "calls": done}


def backfill(url: str) -> dict:
    """Step down to 0005, then time ``upgrade 0006``; counts the search rows it wrote."""
    engine = sa.create_engine(url)
    try:
        downgrade(engine, "0005")
        t = time.perf_counter()
        upgrade(engine, "0006")
        took = time.perf_counter() - t
        with engine.connect() as conn:
            indexed = conn.execute(sa.text("SELECT count(*) FROM call_search")).scalar_one()
            calls = conn.execute(sa.text("SELECT count(*) FROM calls")).scalar_one()
        upgrade(engine, "head")
    finally:
        engine.dispose()
    return {"backfill_s": round(took, 1), "calls_per_s": round(calls / took) if took else None, "indexed": indexed}


def run_sqlite(n: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="of_bench_backfill_"))
    url = f"sqlite:///{tmp / 'store.sqlite'}"
    open_store(url, settings=Settings(home=tmp / "home")).close()  # schema at head
    t = time.perf_counter()
    sizes = build_sqlite(url, n)
    built = round(time.perf_counter() - t, 1)
    out = {"backend": "sqlite", **sizes, "build_s": built, **backfill(url),
           "db_mb": round((tmp / "store.sqlite").stat().st_size / 2**20)}
    (tmp / "store.sqlite").unlink()
    return out


def run_postgres(n: int, admin: str) -> dict:
    name = f"of_bench_backfill_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = sa.engine.make_url(admin).set(drivername="postgresql+psycopg", database=name)
    url = url.render_as_string(hide_password=False)
    try:
        open_store(url, settings=Settings(home=Path(f"/tmp/{name}"))).close()
        t = time.perf_counter()
        sizes = build_pg(url, n)
        built = round(time.perf_counter() - t, 1)
        return {"backend": "postgresql", **sizes, "build_s": built, **backfill(url)}
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--sqlite", action="store_true")
    ap.add_argument("--postgres", action="store_true")
    ap.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = ap.parse_args()
    if not (args.sqlite or args.postgres):
        args.sqlite = args.postgres = True
    if args.sqlite:
        print(json.dumps(run_sqlite(args.calls)), flush=True)
    if args.postgres:
        print(json.dumps(run_postgres(args.calls, args.pg_admin)), flush=True)


if __name__ == "__main__":
    main()
