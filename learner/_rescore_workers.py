"""The Hugging Face scorer's processes: ``rescore_step.py`` run as several workers at once, each on a contiguous
share of the calls (whole rollouts, in the step's order), their lines consumed by one thread into the sink.

Why several: a re-score pass is a few hundred tokens through a 576-wide model, matrices too small for two threads
to share well. On a 2-core machine (2026-12-04, SmolLM2-135M in float32, 1,200-token passes, a pip install running
beside it) one process of 2 threads passed 436 tokens/s, two processes of 1 thread about 282 each; on a quiet
machine ``bench/rescore.py`` re-scored a demo-sized store's two versions in 4.85 min with 2 workers against 5.94 with
1. Each worker keeps its own shared start, so a split costs one cold start per worker.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from forge_store import TokenCall

from ._rescore_sink import RescoreError, RescoreResult, Sink

STEP_SCRIPT = Path(__file__).with_name("rescore_step.py")
MAX_WORKERS = 8


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """One single-thread worker per core this process may use, at most ``MAX_WORKERS``."""
    return max(1, min(MAX_WORKERS, cores()))


def step_order(calls: Sequence[TokenCall]) -> list[TokenCall]:
    """A rollout's calls together in ``seq`` order, the rollouts in the order of their first prompt's ids, so that
    neighbours share the longest start (the system prompt and tools, a group's task), which the step reads from
    the last pass's keys and values."""
    first: dict[str, list[int]] = {}
    for c in sorted(calls, key=lambda c: c.seq):
        first.setdefault(c.rollout_id, c.prompt_token_ids)
    return sorted(calls, key=lambda c: (first[c.rollout_id], c.rollout_id, c.seq))


def write_step_input(calls: Sequence[TokenCall], path: Path) -> None:
    """``rescore_step.py``'s ``--calls`` file, in :func:`step_order`."""
    with open(path, "w") as f:
        for c in step_order(calls):
            f.write(json.dumps({"call_id": c.id, "rollout_id": c.rollout_id, "prompt_ids": c.prompt_token_ids,
                                "completion_ids": c.completion_token_ids}) + "\n")


def split(calls: Sequence[TokenCall], parts: int) -> list[list[TokenCall]]:
    """The calls in step order cut into at most ``parts`` contiguous shares of whole rollouts, of about equal cost
    (a rollout costs about its longest sequence: its shorter calls are prefixes of it)."""
    rollouts: list[list[TokenCall]] = []
    for c in step_order(calls):
        if rollouts and rollouts[-1][0].rollout_id == c.rollout_id:
            rollouts[-1].append(c)
        else:
            rollouts.append([c])
    cost = [max(len(c.full or b"") // 4 for c in r) + 1 for r in rollouts]
    parts = min(parts, len(rollouts))
    total, out, done = sum(cost), [[]], 0
    for i, (r, k) in enumerate(zip(rollouts, cost)):
        left = len(rollouts) - i   # rollouts not placed yet, this one included
        if out[-1] and len(out) < parts and (done + k / 2 >= total * len(out) / parts or left == parts - len(out)):
            out.append([])
        out[-1] += r
        done += k
    return out if out[0] else []


def run_workers(python: Path, model: Path, dtype: str, todo: Sequence[TokenCall], res: RescoreResult, sink: Sink,
                timeout_s: float, workers: int) -> None:
    """Score ``todo`` with up to ``workers`` (>= 1) step processes (each with cores / workers threads) into
    ``sink``."""
    by_id = {c.id: c for c in todo}
    shares = split(todo, workers)
    threads = max(1, cores() // len(shares))
    lines: queue.Queue = queue.Queue()
    with tempfile.TemporaryDirectory(prefix="openforge-rescore-") as tmp:
        procs, errs = [], []
        try:
            for i, share in enumerate(shares):
                path = Path(tmp) / f"calls-{i}.jsonl"
                write_step_input(share, path)
                errs.append(open(Path(tmp) / f"stderr-{i}", "w+"))
                procs.append(subprocess.Popen(
                    [str(python), str(STEP_SCRIPT), "--model", str(model), "--calls", str(path), "--dtype", dtype,
                     "--threads", str(threads)], stdout=subprocess.PIPE, stderr=errs[-1], text=True))
                threading.Thread(target=_pump, args=(i, procs[-1], lines), daemon=True).start()
            timer = threading.Timer(timeout_s, lambda: [p.kill() for p in procs])
            timer.start()
            try:
                failed = _consume(procs, lines, by_id, res, sink)
            finally:
                timer.cancel()
            sink.write()
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
            tails = []
            for f in errs:
                f.seek(0)
                tails.append(f.read()[-3000:])
                f.close()
    counts = [ln for t in tails for ln in t.splitlines() if ln.startswith("rescore-step: ")]
    if failed is None and counts:   # each worker's own count: tokens through the model, and from a shared start
        for ln in counts:
            sink.say(ln if len(counts) == 1 else ln.replace("rescore-step: ", f"rescore-step ({len(counts)} workers): ", 1))
    if failed is not None:
        rc = procs[failed].returncode
        raise RescoreError(f"the re-score step failed (exit {rc}{', killed after ' + str(timeout_s) + ' s' if rc < 0 else ''}"
                           f"); {res.written} re-scores were stored and a run again resumes after them:\n{tails[failed]}")


def _pump(i: int, proc: subprocess.Popen, lines: queue.Queue) -> None:
    for line in proc.stdout:
        lines.put((i, line))
    lines.put((i, None))


def _consume(procs, lines: queue.Queue, by_id: dict[str, TokenCall], res: RescoreResult, sink: Sink) -> int | None:
    """Every worker's lines into the sink until all have ended; the index of the first that failed (the others
    are killed then), or None."""
    open_, failed, lineage = len(procs), None, None
    while open_:
        i, line = lines.get()
        if line is None:
            open_ -= 1
            if procs[i].wait() != 0 and failed is None:
                failed = i
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            continue
        msg = json.loads(line)
        if "lineage" in msg:
            if lineage is None:   # the workers run the same code on the same weights: the first one speaks for all
                lineage = {**msg["lineage"], "workers": len(procs)}
                res.lineage.update(lineage)
            continue
        if failed is None:
            sink.add(by_id[msg["call_id"]], msg["logprobs"])
    return failed
