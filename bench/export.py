"""Export benchmark: a synthetic store of >= 100,000 calls (SQLite, or PostgreSQL with --postgres), exported as
veRL shards.

Builds the store fast (store ops batched into few transactions) in a child process, then times ``learner.export``
in this one, so ``peak_rss_mb`` is the export's own peak (this process's imports included, the build's memory not).
Prints a JSON object as the last line: samples_per_s (and per CPU second of this process and its export workers),
peak_rss_mb (this process's peak, as before workers existed), peak_rss_tree_mb (the largest sum of this process's
and its workers' resident memory, sampled every 20 ms: pages a worker shares with its parent after the fork count
twice), merge_rate (and sizes). ``--workers N`` sets the export's workers (default: the export's own choice, one
per core for a store this size; 1 plans in this process alone). Never asserts times.
``--reference`` times the reference path instead (``export(..., batched=False)``: every call read in full and
reconstructed from Python lists, as exports were read before the batched path).
Usage: python bench/export.py [--rollouts 10000] [--turns 10] [--group 8] [--postgres [ADMIN_URL]] [--reference]
       [--workers N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import resource
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forge_store import CallRecord, Settings, open_store  # noqa: E402
from forge_store._write.db_apply import apply_ops  # noqa: E402  (bench only: batch the writes)
from learner import ExportConfig, export  # noqa: E402

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def build(st, rollouts: int, turns: int, group: int, seed: int = 0) -> int:
    ops: list[dict] = []
    st._write = ops.append  # collect ops, apply them in large transactions below
    rng = random.Random(seed)
    st.register_task("t", source="bench")
    st.register_harness("bench", "1")
    st.register_policy_version("p", model_name="m", global_step=1)
    n_calls = 0
    for g in range(rollouts // group):
        gid = f"g{g:06d}"
        st.create_group(gid, task_id="t", target_size=group, policy_version_id="p")
        for k in range(group):
            rid = f"{gid}r{k}"
            st.start_rollout(rid, group_id=gid, task_id="t", policy_version_id="p", harness_id="bench@1")
            prompt = [rng.randrange(32000) for _ in range(200)]
            for t in range(turns):
                if k % 5 == 0 and t == turns // 2:  # compaction: a fresh, shorter prompt
                    prompt = prompt[:50] + [rng.randrange(32000) for _ in range(20)]
                comp = [rng.randrange(32000) for _ in range(50)]
                st.record_call(CallRecord(
                    id=f"{rid}c{t}", rollout_id=rid, seq=t, api_surface="chat.completions",
                    messages=[{"role": "user", "content": f"{rid} turn {t}"}], started_at=T0 + timedelta(seconds=t),
                    prompt_token_ids=prompt, completion_token_ids=comp, completion_logprobs=[-0.25] * 50,
                    finish_reason="stop", token_exact=True, policy_version_id="p", response={"text": "ok"}))
                n_calls += 1
                prompt = prompt + comp + [rng.randrange(32000) for _ in range(30)]
            st.finish_rollout(rid, "success" if rng.random() < 0.5 else "failure", ended_at=T0)
            st.add_reward(rid, float(rng.random() < 0.5), verifier_version="v1")
        if len(ops) > 20_000:
            _apply(st, ops)
    _apply(st, ops)
    return n_calls


def _apply(st, ops: list[dict]) -> None:
    with st.engine.begin() as conn:
        apply_ops(conn, ops)
    ops.clear()


def _build_child(url: str, settings: Settings, args: argparse.Namespace, result) -> None:
    st = open_store(url, settings=settings)
    result.put(build(st, args.rollouts, args.turns, args.group))
    st.close()


def _database(admin: str, drop: str | None = None) -> str:
    """A fresh PostgreSQL database's URL (or, with ``drop``, drop that one)."""
    import psycopg
    import sqlalchemy as sa

    with psycopg.connect(admin, autocommit=True) as conn:
        if drop:
            conn.execute(f'DROP DATABASE IF EXISTS "{drop}" WITH (FORCE)')
            return drop
        name = f"of_bench_export_{uuid.uuid4().hex[:8]}"
        conn.execute(f'CREATE DATABASE "{name}"')
    url = sa.engine.make_url(admin).set(drivername="postgresql+psycopg", database=name)
    return url.render_as_string(hide_password=False)


def _children_cpu() -> float:
    """CPU seconds of this process's children that have ended (export workers, once joined; the build's too)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class _TreeRss:
    """The largest sum of resident memory of this process and its children, sampled every 20 ms."""

    def __init__(self) -> None:
        self.peak, self.done = 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @staticmethod
    def _rss_mb(pid: int) -> float:
        try:
            with open(f"/proc/{pid}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
        except (OSError, StopIteration):
            return 0.0

    def _run(self) -> None:
        me = os.getpid()
        while not self.done.wait(0.02):
            try:
                with open(f"/proc/{me}/task/{me}/children") as f:
                    kids = [int(p) for p in f.read().split()]
            except OSError:
                kids = []
            self.peak = max(self.peak, self._rss_mb(me) + sum(self._rss_mb(k) for k in kids))

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        return self.peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=10_000)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--postgres", nargs="?", const="postgresql://postgres@127.0.0.1:5432/postgres", default=None,
                    metavar="ADMIN_URL", help="Build the store in a new PostgreSQL database (dropped afterwards).")
    ap.add_argument("--reference", action="store_true", help="Time the reference path (batched=False).")
    ap.add_argument("--workers", type=int, default=None, help="Export workers (default: the export's choice).")
    ap.add_argument("--keep", type=Path, default=None, metavar="SQLITE_FILE",
                    help="Build the SQLite store into this file once and export from it on later runs (the same "
                         "--rollouts/--turns/--group; build_s is 0 then).")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(home=Path(tmp) / "home", auto_upgrade=True)  # a migration may land mid-build
        url = _database(args.postgres) if args.postgres else f"sqlite:///{args.keep or Path(tmp) / 'bench.sqlite'}"
        try:
            t0 = time.perf_counter()
            if args.keep and args.keep.exists():
                n_calls = args.rollouts // args.group * args.group * args.turns
            else:
                ctx = multiprocessing.get_context("fork")
                result = ctx.Queue()
                child = ctx.Process(target=_build_child, args=(url, settings, args, result))
                child.start()
                n_calls = result.get()
                child.join()
            build_s = time.perf_counter() - t0
            rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            st = open_store(url, settings=settings)
            sampler = _TreeRss()
            t0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu()
            m = export(st, Path(tmp) / "out", ExportConfig(format="verl"), batched=not args.reference,
                       workers=args.workers)
            export_s, export_cpu_s = time.perf_counter() - t0, time.process_time() - c0 + _children_cpu() - k0
            tree_mb = sampler.stop()
            st.close()
        finally:
            if args.postgres:
                _database(args.postgres, drop=url.rsplit("/", 1)[1])
    samples = m["counts"]["rows"]["trajectories"]
    print(json.dumps({"backend": "postgresql" if args.postgres else "sqlite", "path": "reference" if args.reference
                      else "batched", "calls": n_calls, "rollouts": args.rollouts, "samples": samples,
                      "build_s": round(build_s, 1), "export_s": round(export_s, 2),
                      "samples_per_s": round(samples / export_s, 1), "calls_per_s": round(n_calls / export_s, 1),
                      # this process's CPU seconds (the database's own work on PostgreSQL not counted): on a loaded
                      # machine wall time measures the neighbours, this measures the export
                      "workers": args.workers if args.workers is not None else "auto",
                      "export_cpu_s": round(export_cpu_s, 2), "samples_per_cpu_s": round(samples / export_cpu_s, 1),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                      "peak_rss_tree_mb": round(tree_mb, 1),
                      "rss_before_export_mb": round(rss_before, 1), "merge_rate": m["merge_rate"]}))


if __name__ == "__main__":
    main()
