"""Latency of the dashboards' queries on a synthetic store of one million calls (PostgreSQL, optionally SQLite).

Builds the store with bulk COPY straight into PostgreSQL (not through the journal): ~20k rollouts over 30 days,
50 tasks in 3 domains, 3 policy versions rolled out over time, 2 harnesses with their own tool sets, ~50 calls per
rollout (lognormal), tool calls with JSON arguments, tool results as delta-encoded prompt messages, rewards and
exclusions, and each call's search text (``call_search``, as the store's writer makes it; a command planted in every
4,000th rollout). Then it times each page's queries (median of --repeat warm runs) and prints, as its last line, one
JSON object: ``{"calls": ..., "overview_ms": ..., "trajectory_ms": ..., "behaviour_ms": ..., "search_ms": ...}``
(``timeline_1000_calls_ms``: the Timeline page's reads of a 1,000-call rollout; ``search_ms``: the planted command; ``search_common_ms``: a text in ~8% of calls, newest 50; ``--sqlite`` adds the
same on a SQLite store of as many calls, ``sqlite_search_ms``, ...). With ``--analyze`` it
also times one ``openforge analyze`` over the whole store (``learner.analyze``: every finished rollout's rubrics)
and adds ``analyze_s``, ``analyze_cpu_s`` (this process), ``analyze_workers_cpu_s`` (its worker processes),
``analyze_rollouts``, ``analyze_peak_rss_mb`` and ``analyze_worker_peak_rss_mb`` (the largest worker); ``--url``
measures a store kept by an earlier ``--keep`` run instead of building one.

    python bench/dashboard_queries.py [--calls 1000000] [--pg-admin URL] [--keep] [--analyze] [--url URL] [--sqlite]

Token-id arrays are left out (the dashboards never read them in bulk); everything the pages query is realistic.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import orjson
import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dashboards._context import Context  # noqa: E402
from dashboards._queries import overview, rollout_page  # noqa: E402
from dashboards._timeline import build as timeline_steps, segments, timing_rows  # noqa: E402
from dashboards._views.behaviour import compare  # noqa: E402
from forge_store import Settings, Window, open_store, sha256_hex  # noqa: E402
from forge_store._search_text import call_text  # noqa: E402
from learner import analyze, tool_steps  # noqa: E402

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
LONG = 1000  # the calls of rollout r000000 (stores of over 100 rollouts), whose Timeline page is timed
PLANTED = "rm -rf /srv/planted"  # one call of every 4,000th rollout runs it: what search_ms looks for
COMMON = "Traceback"  # in ~8% of tool results: search_common_ms (the newest 50 of ~80k hits per million calls)
POLICIES = ("pv-100", "pv-200", "pv-300")
HARNESSES = {"react@1.0": ("bash", "read_file", "write_file"), "codex@0.5": ("exec_command", "apply_patch", "shell")}
CALL_COLS = ("id", "rollout_id", "seq", "api_surface", "model", "streamed", "request_hash", "tool_schema_hash",
             "request_params", "prompt_base_call_id", "prompt_base_len", "prompt_tail", "n_prompt_messages",
             "response", "response_message_hash", "finish_reason", "prompt_ids_prefix_len", "n_prompt_tokens",
             "n_completion_tokens", "usage", "started_at", "ended_at", "ttft_ms", "latency_ms", "policy_version_id",
             "token_exact", "ingest_seq")


def _args(tool: str, rng: random.Random, i: int) -> str:
    if tool in ("bash", "shell", "exec_command"):
        cmd = rng.choice(["ls -la", "python -m pytest -q", f"cat src/mod{i % 7}.py", "grep -rn TODO src", "git diff"])
        return json.dumps({"command" if tool != "exec_command" else "cmd": cmd})
    if tool == "apply_patch":
        return json.dumps({"input": f"*** Begin Patch\n*** Update File: src/mod{i % 7}.py\n@@\n-a\n+b\n*** End Patch"})
    if rng.random() < 0.02:
        return "{\"path\": "  # a malformed call now and then
    return json.dumps({"path": f"src/mod{i % 7}.py", **({"content": "x = 1\n"} if tool == "write_file" else {})})


def build(url: str, n_calls: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    n_rollouts = max(1, n_calls // 50)
    lengths = [max(2, int(rng.lognormvariate(math.log(45), 0.45))) for _ in range(n_rollouts)]
    scale = n_calls / sum(lengths)
    lengths = [max(2, round(x * scale)) for x in lengths]
    if n_rollouts > 100:
        lengths[0] = LONG  # one long rollout: timeline_1000_calls_ms
    lengths[-1] += n_calls - sum(lengths)
    seq = 0

    def next_seq() -> int:
        nonlocal seq
        seq += 1
        return seq

    pg = sa.engine.make_url(url).set(drivername="postgresql")
    dsn = pg.render_as_string(hide_password=False)
    # messages and calls stream side by side: two COPYs need two connections
    with psycopg.connect(dsn) as conn, conn.cursor() as cur, psycopg.connect(dsn) as mconn, mconn.cursor() as mcur, \
            psycopg.connect(dsn) as sconn, sconn.cursor() as scur:
        schemas = {}
        for h, tools in HARNESSES.items():
            body = orjson.dumps([{"type": "function", "function": {"name": t, "parameters": {"type": "object"}}}
                                 for t in tools], option=orjson.OPT_SORT_KEYS).decode()
            schemas[h] = sha256_hex(body.encode())
            cur.execute("INSERT INTO tool_schemas (sha256, body, ingest_seq) VALUES (%s, %s, %s)", (schemas[h], body, next_seq()))
            name, version = h.split("@")
            cur.execute("INSERT INTO harnesses (id, name, version, created_at, ingest_seq) VALUES (%s,%s,%s,%s,%s)",
                        (h, name, version, T0, next_seq()))
        for i, pv in enumerate(POLICIES):
            cur.execute("INSERT INTO policy_versions (id, model_name, global_step, created_at, ingest_seq) "
                        "VALUES (%s,%s,%s,%s,%s)", (pv, "bench-model", 100 * (i + 1), T0, next_seq()))
        for t in range(50):
            meta = json.dumps({"required_tools": ["bash", "write_file"], "reference_steps": 20 + t})
            cur.execute("INSERT INTO tasks (id, domain, metadata, created_at, ingest_seq) VALUES (%s,%s,%s,%s,%s)",
                        (f"task-{t}", ("swe", "data", "web")[t % 3], meta, T0, next_seq()))
        msg_copy = mcur.copy("COPY messages (sha256, role, body, size, ingest_seq) FROM STDIN")
        search_copy = scur.copy("COPY call_search (ingest_seq, call_id, rollout_id, body) FROM STDIN")
        with msg_copy as mc, search_copy as sc, cur.copy(f"COPY calls ({', '.join(CALL_COLS)}) FROM STDIN") as cc:
            rollouts, rewards, exclusions, seen = [], [], [], set()
            for r, n in enumerate(lengths):
                rid = f"r{r:06d}"
                frac = r / n_rollouts
                pv = POLICIES[min(2, int(frac * 3 + rng.random() * 0.3))]
                harness = rng.choice(list(HARNESSES))
                tools = HARNESSES[harness]
                start = T0 + timedelta(days=30 * frac, seconds=rng.random() * 60)
                p_ok = 0.35 + 0.1 * POLICIES.index(pv)
                u = rng.random()
                outcome = ("infra_error" if u < 0.02 else "policy_timeout" if u < 0.07 else "harness_error" if u < 0.10
                           else "cancelled" if u < 0.105 else "success" if rng.random() < p_ok else "failure")
                t = start
                prev_id, prev_len, last_tc = None, 0, {}
                for i in range(n):
                    cid = f"{rid}-{i:03d}"
                    if i == 0:
                        new = [{"role": "system", "content": "You are a careful agent."},
                               {"role": "user", "content": f"Solve task {r % 50}."}]
                    else:
                        new = [{"role": "assistant", "content": None, "tool_calls": [last_tc]},
                               {"role": "tool", "tool_call_id": last_tc["id"],
                                "content": ("Traceback (most recent call last):\nValueError: bad\nexit code 1"
                                            if rng.random() < 0.08 else f"ok {rid} {i}\n" + "x" * rng.randint(20, 400))}]
                    tail = []
                    for m in new:
                        body = orjson.dumps(m, option=orjson.OPT_SORT_KEYS).decode()
                        h = sha256_hex(body.encode())
                        if h not in seen:
                            seen.add(h)
                            mc.write_row((h, m["role"], body, len(body), next_seq()))
                        tail.append(h)
                    last = i == n - 1
                    tool = rng.choice(tools)
                    args = _args(tool, rng, i)
                    if r % 4000 == 7 and i == n // 2:
                        tool, args = tools[0], json.dumps({"command": f"{PLANTED}/{rid}"})
                    last_tc = {"id": f"{cid}-t", "type": "function", "function": {"name": tool, "arguments": args}}
                    response = {"text": "done" if last else None, "tool_calls": None if last else [last_tc], "reasoning": None}
                    lat = rng.lognormvariate(math.log(1500), 0.5)
                    end = t + timedelta(milliseconds=lat)
                    n_prompt = 600 + 180 * i
                    cc.write_row((cid, rid, i, "chat.completions", "bench-model", False, uuid.uuid4().hex * 2,
                                  schemas[harness], '{"temperature": 1.0}', prev_id, prev_len, json.dumps(tail),
                                  prev_len + len(tail), json.dumps(response), None, "stop" if last else "tool_calls",
                                  0, n_prompt, 60, json.dumps({"prompt_tokens": n_prompt, "completion_tokens": 60}),
                                  t, end, 150.0, lat, pv, False, next_seq()))
                    answer = {"role": "assistant", "content": response["text"], "tool_calls": response["tool_calls"]}
                    sc.write_row((seq, cid, rid, call_text(new[1:] if i else new, answer)))  # the writer's text
                    prev_id, prev_len = cid, prev_len + len(tail)
                    t = end + timedelta(milliseconds=rng.lognormvariate(math.log(800), 0.7))
                rollouts.append((rid, f"task-{r % 50}", harness, pv, "local", "img:bench", "sha256:" + "cd" * 32,
                                 1, "finished", outcome, start, t, next_seq(), seq))
                if outcome in ("success", "failure", "policy_timeout", "harness_error"):
                    rewards.append((f"w{r}", rid, 1.0 if outcome == "success" else 0.0, "verifier", t, next_seq()))
                elif outcome == "infra_error":
                    exclusions.append((f"x{r}", rid, "infra_error", t, next_seq()))
        mconn.commit()
        sconn.commit()
        with cur.copy("COPY rollouts (id, task_id, harness_id, policy_version_id, backend, image_ref, image_digest, "
                      "attempt, status, outcome, started_at, ended_at, ingest_seq, finished_seq) FROM STDIN") as c:
            for row in rollouts:
                c.write_row(row)
        with cur.copy("COPY rewards (id, rollout_id, value, source, created_at, ingest_seq) FROM STDIN") as c:
            for row in rewards:
                c.write_row(row)
        with cur.copy("COPY exclusions (id, rollout_id, reason, created_at, ingest_seq) FROM STDIN") as c:
            for row in exclusions:
                c.write_row(row)
        cur.execute("UPDATE ingest_counter SET value = %s WHERE id = 1", (seq,))
        conn.commit()
        conn.autocommit = True
        cur.execute("VACUUM ANALYZE")
    return {"rollouts": n_rollouts, "calls": sum(lengths)}


def build_sqlite_search(url: str, n_calls: int, seed: int = 0) -> dict:
    """A SQLite store for the search timings: rollouts, calls (the columns a search joins) and each call's search
    text, written with executemany (the FTS5 index follows by migration 0006's trigger, as with the writer)."""
    rng = random.Random(seed)
    n_rollouts = max(1, n_calls // 50)
    engine = sa.create_engine(url)
    seq, done = 0, 0
    with engine.begin() as conn:
        for r in range(n_rollouts):
            rid, n = f"r{r:06d}", (50 if r < n_rollouts - 1 else max(1, n_calls - done))
            pv, start = POLICIES[min(2, r * 3 // n_rollouts)], T0 + timedelta(days=30 * r / n_rollouts)
            calls, texts = [], []
            for i in range(n):
                seq += 1
                cid = f"{rid}-{i:03d}"
                tool = rng.choice(HARNESSES["react@1.0"])
                args = json.dumps({"command": f"{PLANTED}/{rid}"}) if r % 4000 == 7 and i == n // 2 else _args(tool, rng, i)
                result = ("Traceback (most recent call last):\nValueError: bad\nexit code 1" if rng.random() < 0.08
                          else f"ok {rid} {i}\n" + "x" * rng.randint(20, 400))
                answer = {"role": "assistant", "content": None,
                          "tool_calls": [{"id": f"{cid}-t", "function": {"name": tool, "arguments": args}}]}
                calls.append({"id": cid, "rollout_id": rid, "seq": i, "api_surface": "chat.completions",
                              "streamed": False, "request_hash": "0" * 64, "prompt_base_len": 0, "prompt_tail": "[]",
                              "n_prompt_messages": 0, "prompt_ids_prefix_len": 0, "started_at": start,
                              "token_exact": False, "policy_version_id": pv, "ingest_seq": seq})
                texts.append({"ingest_seq": seq, "call_id": cid, "rollout_id": rid,
                              "body": call_text([{"role": "tool", "content": result}], answer)})
            done += n
            seq += 1
            conn.execute(sa.text("INSERT INTO rollouts (id, task_id, harness_id, policy_version_id, attempt, status, "
                                 "outcome, started_at, ended_at, ingest_seq, finished_seq) VALUES (:id, :task, "
                                 "'react@1.0', :pv, 1, 'finished', :outcome, :start, :start, :seq, :seq)"),
                         {"id": rid, "task": f"task-{r % 50}", "pv": pv, "start": start, "seq": seq,
                          "outcome": "success" if rng.random() < 0.5 else "failure"})
            conn.execute(sa.text("INSERT INTO calls (id, rollout_id, seq, api_surface, streamed, request_hash, "
                                 "prompt_base_len, prompt_tail, n_prompt_messages, prompt_ids_prefix_len, started_at, "
                                 "token_exact, policy_version_id, ingest_seq) VALUES (:id, :rollout_id, :seq, "
                                 ":api_surface, :streamed, :request_hash, :prompt_base_len, :prompt_tail, "
                                 ":n_prompt_messages, :prompt_ids_prefix_len, :started_at, :token_exact, "
                                 ":policy_version_id, :ingest_seq)"), calls)
            conn.execute(sa.text("INSERT INTO call_search (ingest_seq, call_id, rollout_id, body) VALUES "
                                 "(:ingest_seq, :call_id, :rollout_id, :body)"), texts)
        conn.execute(sa.text("UPDATE ingest_counter SET value = :v WHERE id = 1"), {"v": seq})
    engine.dispose()
    return {"rollouts": n_rollouts, "calls": done}


def timeline_page(store, rid: str) -> None:
    """What the Timeline page reads and computes for a rollout (its drawing is Streamlit's, in the browser)."""
    steps = timeline_steps(store.timeline(rid))
    segments(steps), timing_rows(steps)
    store.rollout(rid), store.rewards(rid), store.exclusion_reasons([rid])


def record_long_rollout(url: str, home: Path, rid: str = "long-1000") -> None:
    """A 1,000-call rollout through ``Store.record_call`` (the real write path: deltas, search text)."""
    from forge_store.testing import Turn, agent_calls

    turns = [Turn([("bash", {"command": f"make step{i}"})], [f"step {i}: " + "output " * 40]) for i in range(LONG)]
    with open_store(url, settings=Settings(home=home)) as st:
        st.start_rollout(rid, task_id="task-0", started_at=T0)
        for rec in agent_calls(rid, turns, started_at=T0):
            st.record_call(rec)
        st.finish_rollout(rid, "success", ended_at=T0 + timedelta(hours=1))


def measure_search(url: str, home: Path, repeat: int) -> dict:
    """``Store.search``: a command planted in a few calls, a text in ~8% of them (newest 50), one filtered."""
    store = open_store(url, settings=Settings(home=home, auto_upgrade=False))
    found = len(store.search(PLANTED, limit=100)[0])
    out = {"search_ms": _timed(lambda: store.search(PLANTED), repeat), "search_hits": found,
           "search_common_ms": _timed(lambda: store.search(COMMON), repeat),
           "search_filtered_ms": _timed(lambda: store.search(COMMON, policy_version_id=POLICIES[1],
                                                             outcome="success"), repeat)}
    store.close()
    return out


def _timed(fn, repeat: int) -> float:
    fn()  # warm the caches once, as a dashboard user would
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return round(statistics.median(times), 1)


def measure(url: str, home: Path, repeat: int) -> dict:
    store = open_store(url, settings=Settings(home=home, auto_upgrade=False))
    window = Window(since=T0 + timedelta(days=0), until=T0 + timedelta(days=31))
    ctx = Context(store=store, window=window)
    rid = rollout_page(store, window, {})[0]["id"].iloc[0]

    def overview_page():
        overview(store, window)

    def trajectory_page():
        options = store.stats.filter_options()
        rollout_page(store, window, {"task_id": options["task_id"][3], "outcome": "success"}, page=1)
        traj = store.trajectory(rid)
        tool_steps(traj.calls)

    def behaviour_page():
        store.stats.filter_options()
        compare(ctx, "policy_version_id", POLICIES[0], POLICIES[2])

    out = {"overview_ms": _timed(overview_page, repeat), "trajectory_ms": _timed(trajectory_page, repeat),
           "behaviour_ms": _timed(behaviour_page, repeat),
           **({"timeline_1000_calls_ms": _timed(lambda: timeline_page(store, "r000000"), repeat)}
              if len(store.timeline("r000000")) == LONG else {})}
    store.close()
    return {**out, **measure_search(url, home, repeat)}


def measure_analyze(url: str, home: Path) -> dict:
    """One ``openforge analyze`` (by policy version, the command's default) over every finished rollout."""
    store = open_store(url, settings=Settings(home=home, auto_upgrade=False))
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    t, c = time.perf_counter(), time.process_time()
    report = analyze(store)
    took, cpu = time.perf_counter() - t, time.process_time() - c
    done = resource.getrusage(resource.RUSAGE_CHILDREN)  # the worker processes analyze scores batches in
    store.close()
    return {"analyze_s": round(took, 1), "analyze_cpu_s": round(cpu, 1),  # this process's CPU, not the database's
            "analyze_workers_cpu_s": round(done.ru_utime + done.ru_stime - kids.ru_utime - kids.ru_stime, 1),
            "analyze_rollouts": sum(r["rollouts"] for r in report["summary"]),
            "analyze_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "analyze_worker_peak_rss_mb": round(done.ru_maxrss / 1024, 1)}


def _sqlite(n_calls: int, home: Path, repeat: int) -> dict:
    url = f"sqlite:///{home / 'search-bench.sqlite'}"
    open_store(url, settings=Settings(home=home)).close()  # schema at head
    t = time.perf_counter()
    build_sqlite_search(url, n_calls)
    built = round(time.perf_counter() - t, 1)
    timings = measure_search(url, home, repeat)
    record_long_rollout(url, home)
    with open_store(url, settings=Settings(home=home, auto_upgrade=False)) as st:
        timings["timeline_1000_calls_ms"] = _timed(lambda: timeline_page(st, "long-1000"), repeat)
    (home / "search-bench.sqlite").unlink()
    return {"sqlite_calls": n_calls, "sqlite_build_s": built, **{f"sqlite_{k}": v for k, v in timings.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="Keep the benchmark database (its URL is printed).")
    ap.add_argument("--analyze", action="store_true", help="Also time openforge analyze over the whole store.")
    ap.add_argument("--url", help="Measure this store (kept by an earlier --keep run) instead of building one.")
    ap.add_argument("--sqlite", action="store_true", help="Also build a SQLite store (rollouts, calls, search text) "
                    "and time search on it (sqlite_search_ms, ...).")
    ap.add_argument("--sqlite-calls", type=int, help="Calls of the SQLite store (default: --calls).")
    args = ap.parse_args()
    if args.url:
        home = Path(f"/tmp/of_bench_dash_home_{uuid.uuid4().hex[:8]}")
        result = {"backend": "postgresql", **(measure_analyze(args.url, home) if args.analyze else {}),
                  **measure(args.url, home, args.repeat)}
        print(json.dumps(result))
        return
    name = f"of_bench_dash_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.pg_admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = sa.engine.make_url(args.pg_admin).set(drivername="postgresql+psycopg", database=name)
    url = url.render_as_string(hide_password=False)
    home = Path(f"/tmp/{name}")
    try:
        open_store(url, settings=Settings(home=home)).close()  # schema at head
        t = time.perf_counter()
        sizes = build(url, args.calls)
        build_s = round(time.perf_counter() - t, 1)
        print(f"built {sizes['calls']:,} calls in {sizes['rollouts']:,} rollouts in {build_s}s ({url})", file=sys.stderr)
        result = {"backend": "postgresql", **sizes, "build_s": build_s,
                  **(measure_analyze(url, home) if args.analyze else {}), **measure(url, home, args.repeat)}
        if args.sqlite:
            result.update(_sqlite(args.sqlite_calls or args.calls, home, args.repeat))
    finally:
        if not args.keep:
            with psycopg.connect(args.pg_admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(json.dumps(result))


if __name__ == "__main__":
    main()
