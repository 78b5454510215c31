"""The facts of every finished rollout, streamed in batches: :func:`iter_facts`, what ``openforge analyze`` sums.

A batch's calls and rewards are read in one go (``Store.call_summaries``, ``Store.latest_rewards``) and its rubrics
computed with a :class:`learner._rubric_cache.RubricCache`. A store of more than a few batches is spread over
worker processes (forked, so that no script needs a ``__main__`` guard; each opens its own connection by URL and
never touches the inherited ones; batches go out in order and their facts come back in order, so every sum adds
the same values in the same order as one process would); a small one stays in
this process, with the next batch read in a thread while this one is scored. Either way memory holds a few
batches, never every rollout.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from forge_store import RolloutFilter, RolloutInfo, Settings, Store, open_store

from ._analysis_config import RubricConfig
from ._rubric_cache import RubricCache
from ._rubrics import RolloutRubrics

# a store with at least this many batches of finished rollouts is scored in worker processes (when workers=None)
POOL_AFTER_BATCHES = 8


@dataclass(frozen=True)
class RolloutFacts:
    """What the analysis needs of one rollout."""

    info: RolloutInfo
    harness: str
    domain: str
    reward: float | None
    passed: bool
    latency_s: float | None
    rubrics: RolloutRubrics

    def key(self, by: str) -> str:
        if by == "policy_version":
            return self.info.policy_version_id or "(none)"
        return self.harness if by == "harness" else self.domain


def _passed(outcome: str | None, reward: float | None, config: RubricConfig) -> bool:
    return reward >= config.pass_threshold if reward is not None else outcome == "success"


class _Lineage:
    """What the facts of any rollout need from the small lineage tables, read once."""

    def __init__(self, store: Store):
        self.tasks = {t["id"]: t for t in store.lineage("tasks")}
        self.harnesses = {h["id"]: h for h in store.lineage("harnesses")}


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off for a pass over the store, back as it was after. A batch allocates some 10^5
    containers (decoded JSON, none of them cyclic) and the collections they trigger traverse every live object
    again and again: half the CPU of a read of the bench store. What a batch drops is freed by reference counting
    as before; only cycles (none are made here) would wait for the collector's return."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def iter_facts(store: Store, *, config: RubricConfig, since: datetime | None = None,
               flt: RolloutFilter | None = None, limit: int | None = None, sources: tuple[str, ...] | None = None,
               progress: Callable[[int], None] | None = None, batch_size: int = 200,
               workers: int | None = None) -> Iterator[RolloutFacts]:
    """Facts of every finished rollout (started at or after ``since``; the first ``limit``), in ingest order.
    ``workers``: processes to score batches in (None: up to two, for a store of ``POOL_AFTER_BATCHES`` batches or
    more; 1: this process, as always in a daemonic one). ``progress`` gets the count done after each batch but a
    last short one."""
    batches = _batches(store, flt, since, limit, batch_size)
    head = list(itertools.islice(batches, POOL_AFTER_BATCHES))
    if workers is None:
        workers = min(2, os.cpu_count() or 1) if len(head) == POOL_AFTER_BATCHES else 1
    if multiprocessing.current_process().daemon:  # a daemonic process may not start processes
        workers = 1
    scored = (_in_pool if workers > 1 else _in_process)(store, itertools.chain(head, batches), config, sources,
                                                           workers)
    done = 0
    for (batch, report), facts in scored:
        yield from facts
        done += len(batch)
        if progress and report:
            progress(done)


def _batches(store: Store, flt: RolloutFilter | None, since: datetime | None, limit: int | None,
             batch_size: int) -> Iterator[tuple[list[RolloutInfo], bool]]:
    """The finished rollouts in batches, in ingest order, each with whether progress hears of it."""
    batch: list[RolloutInfo] = []
    taken = 0
    for info in store.iter_rollouts(flt or RolloutFilter(finished=True)):
        if info.status != "finished" or (since is not None and info.started_at < since):
            continue
        batch.append(info)
        if len(batch) == batch_size or (limit is not None and taken + len(batch) >= limit):
            taken += len(batch)
            yield batch, True
            batch = []
            if limit is not None and taken >= limit:
                return
    if batch:
        yield batch, False


def _reads(store: Store, infos: Sequence[RolloutInfo], sources: tuple[str, ...] | None) -> tuple[dict, dict]:
    ids = [i.id for i in infos]
    return store.call_summaries(ids), store.latest_rewards(ids, sources=sources)


def rollout_facts(store: Store, infos: Sequence[RolloutInfo], *, config: RubricConfig,
                  sources: tuple[str, ...] | None = None, lineage: _Lineage | None = None,
                  cache: RubricCache | None = None) -> list[RolloutFacts]:
    """Facts and rubrics of these rollouts (one batched read of their calls and one of their rewards)."""
    if not infos:
        return []
    return list(_facts(infos, *_reads(store, infos, sources), config=config, lineage=lineage or _Lineage(store),
                       cache=cache or RubricCache(config)))


def _facts(infos: Sequence[RolloutInfo], calls_of: dict, rewards: dict, *, config: RubricConfig, lineage: _Lineage,
           cache: RubricCache) -> Iterator[RolloutFacts]:
    for info in infos:
        task = lineage.tasks.get(info.task_id) or {}
        h = lineage.harnesses.get(info.harness_id)
        harness = f"{h['name']}@{h['version']}" if h and h.get("version") else (h["name"] if h else (info.harness_id or "(none)"))
        value = rewards[info.id].value if info.id in rewards else None
        latency = (info.ended_at - info.started_at).total_seconds() if info.ended_at else None
        yield RolloutFacts(info=info, harness=harness, domain=task.get("domain") or "(none)", reward=value,
                           passed=_passed(info.outcome, value, config), latency_s=latency,
                           rubrics=cache.rubrics(calls_of.get(info.id, []), task_metadata=task.get("metadata"),
                                                 rollout_id=info.id))


Batch = tuple[list[RolloutInfo], bool]


def _in_process(store: Store, batches: Iterable[Batch], config: RubricConfig, sources: tuple[str, ...] | None,
                _workers: int) -> Iterator[tuple[Batch, list[RolloutFacts]]]:
    """Each batch scored here; the next one's reads (mostly waiting on the database) run in a thread meanwhile."""
    lineage, cache = _Lineage(store), RubricCache(config)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="analyze-read") as pool:
        pending: tuple[Batch, Future] | None = None
        for batch in batches:
            ahead = (batch, pool.submit(_reads, store, batch[0], sources))
            if pending is not None:
                yield pending[0], list(_facts(pending[0][0], *pending[1].result(), config=config, lineage=lineage,
                                              cache=cache))
            pending = ahead
        if pending is not None:
            yield pending[0], list(_facts(pending[0][0], *pending[1].result(), config=config, lineage=lineage,
                                          cache=cache))


def _in_pool(store: Store, batches: Iterable[Batch], config: RubricConfig, sources: tuple[str, ...] | None,
             workers: int) -> Iterator[tuple[Batch, list[RolloutFacts]]]:
    """Batches scored by ``workers`` processes, two in flight per worker, results taken in submission order."""
    url = store.engine.url.render_as_string(hide_password=False)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_start_worker,
                             initargs=(url, store.settings, config, sources)) as pool:
        inflight: deque[tuple[Batch, Future]] = deque()
        for batch in batches:
            inflight.append((batch, pool.submit(_score_batch, batch[0])))
            if len(inflight) >= 2 * workers:
                done, fut = inflight.popleft()
                yield done, fut.result()
        while inflight:
            done, fut = inflight.popleft()
            yield done, fut.result()


_worker: dict = {}  # in a worker process: its store, lineage, cache, config and reward sources


def _start_worker(url: str, settings: Settings, config: RubricConfig, sources: tuple[str, ...] | None) -> None:
    gc.disable()  # a worker only scores batches: see collector_paused
    store = open_store(url, settings=settings)
    _worker.update(store=store, lineage=_Lineage(store), cache=RubricCache(config), config=config, sources=sources)


def _score_batch(infos: list[RolloutInfo]) -> list[RolloutFacts]:
    w = _worker
    return rollout_facts(w["store"], infos, config=w["config"], sources=w["sources"], lineage=w["lineage"],
                         cache=w["cache"])
