"""``learner.rescore``: teacher-forced logprobs of stored completions under a policy version, kept in the store.

The calls come from the store's token ids (``Store.token_calls``: the prompt ids and completion ids the engine
reported, never re-tokenized) and are scored by a scorer from :data:`SCORERS`:

* ``hf-float32`` (``hf-bfloat16``): the Hugging Face model of the version's checkpoint folder on the CPU, run by
  ``rescore_step.py`` in an environment with torch and transformers (the vLLM CPU one for ``openforge rescore``);
* ``vllm-served``: the at-scale scorer, a vLLM OpenAI server that serves the version (``--engine URL``, or the
  engine replicas behind a proxy whose active version it is, ``--proxy URL``), asked for ``prompt_logprobs`` of
  the stored ids, a few requests at once (``_rescore_served``). No checkpoint folder is read here.

Results land in the store's append-only ``rescores`` table keyed by (call, version, scorer), a batch at a time as
they come (``_rescore_sink``, the same for every scorer): a re-score run again writes nothing, and one that was
killed or stopped by an error resumes with the calls it had not stored.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from forge_store import Store, TokenCall, rescored_call_ids

from . import _rescore_served as served_scorer
from ._export_config import where_row
from ._query import parse_where
from ._rescore_sink import RescoreError, RescoreResult, Sink
from ._rescore_workers import default_workers, run_workers

HF_SCORERS = {"hf-float32": "float32", "hf-bfloat16": "bfloat16"}   # scorer name -> the step's --dtype
SCORERS = [*HF_SCORERS, served_scorer.SERVED_SCORER]
READ_ROLLOUTS = 200    # rollouts whose calls are read at once
FLUSH_CALLS = 32       # re-scores written per transaction (what a kill can lose)


@dataclass
class Selection:
    rollout_ids: list[str]
    call_ids: set[str] | None = None   # None: every call of those rollouts
    what: str = "every rollout"


def select(store: Store, *, where: str | None = None, export_id: str | None = None,
           rollout_id: str | None = None) -> Selection:
    """The calls to re-score: one rollout, an export's calls (the ``call_ids`` of its shard rows), the rollouts a
    ``--where`` matches, or every rollout."""
    if sum(x is not None for x in (where, export_id, rollout_id)) > 1:
        raise RescoreError("pick the calls one way: --where, --export or --rollout, not several")
    if rollout_id is not None:
        if not store.rollouts([rollout_id]):
            raise RescoreError(f"--rollout {rollout_id!r} is not a rollout in the store; `openforge store info` "
                               "and the dashboard list them")
        return Selection([rollout_id], what=f"rollout {rollout_id}")
    if export_id is not None:
        return _export_selection(store, export_id)
    infos = list(store.iter_rollouts())
    if where is None:
        return Selection([i.id for i in infos])
    pred = parse_where(where)
    rewards = store.latest_rewards([i.id for i in infos])
    return Selection([i.id for i in infos if pred(where_row(i, rewards.get(i.id)))], what=f"--where {where!r}")


def _export_selection(store: Store, export_id: str) -> Selection:
    rows = [r for r in store.lineage("exports") if r["id"] == export_id or r["id"].startswith(export_id)]
    if len(rows) != 1:
        known = ", ".join(r["id"][:12] for r in store.lineage("exports")) or "(none)"
        raise RescoreError(f"--export {export_id!r} {'matches several exports' if rows else 'is not an export in the store'}"
                           f"; pass an export id (known: {known})")
    row = rows[0]
    folder = Path(row["out_dir"] or "")
    files = [folder / f["path"] for f in (row["manifest"] or {}).get("files", ()) if f["path"].endswith(".parquet")
             and not f["path"].startswith("rl_prompts")]
    if not files or not all(f.is_file() for f in files):
        raise RescoreError(f"--export {export_id}: its shard files are not in {folder} on this machine; pass "
                           "--where with the export's query instead, or copy the export there")
    calls, rollouts = set(), set()
    for f in files:
        for r in pq.read_table(f, columns=["rollout_id", "call_ids"]).to_pylist():
            rollouts.add(r["rollout_id"])
            calls.update(r["call_ids"] or ())
    return Selection(sorted(rollouts), calls, what=f"export {row['id'][:12]}")


def _version(store: Store, version: str) -> dict:
    rows = {r["id"]: r for r in store.lineage("policy_versions")}
    if version not in rows:
        raise RescoreError(f"--version {version!r} is not a policy version in the store; known: "
                           f"{', '.join(rows) or '(none)'}")
    return rows[version]


def _checkpoint(row: dict, version: str, checkpoint: Path | None) -> Path:
    path = checkpoint or (Path(row["checkpoint_id"]) if row.get("checkpoint_id") else None)
    if path is None or not (path / "config.json").is_file():
        raise RescoreError(f"policy version {version!r} has no checkpoint folder on this machine (checkpoint_id "
                           f"{row.get('checkpoint_id')!r}); pass --checkpoint DIR with its Hugging Face weights")
    return path


def weights_sha256(folder: Path) -> str:
    """sha256 over the folder's ``*.safetensors`` in name order (how ``openforge train`` hashes a checkpoint)."""
    digest = hashlib.sha256()
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def _eligible(call: TokenCall, skipped: dict[str, int]) -> bool:
    why = None
    if not call.completion:
        why = "no_completion_ids"
    elif call.full is None or call.n_prompt < 1:
        why = "no_prompt_ids"
    elif not call.token_exact:
        why = "not_token_exact"
    if why:
        skipped[why] = skipped.get(why, 0) + 1
    return why is None


def rescore(store: Store, version: str, *, python: Path | None = None, scorer: str = "hf-float32",
            where: str | None = None, export_id: str | None = None, rollout_id: str | None = None,
            checkpoint: Path | None = None, engines: Sequence[str] = (), proxy: str | None = None,
            admin_token: str | None = None, served_model: str | None = None,
            concurrency: int = served_scorer.CONCURRENCY, workers: int | None = None, limit: int | None = None,
            batch: int = FLUSH_CALLS,
            timeout_s: float = 6 * 3600, progress: Callable[[str], None] | None = None) -> RescoreResult:
    """Re-score the selected calls under ``version`` and store what was not stored yet. ``limit``: at most that
    many calls this run (the rest wait for the next: a re-score resumes); ``batch``: re-scores written per
    transaction (what a kill can lose). The ``hf-*`` scorers run ``python`` on the version's checkpoint folder
    (``checkpoint``, default its recorded ``checkpoint_id``); ``vllm-served`` asks ``engines`` (base URLs of vLLM
    servers of the version) or the replicas behind ``proxy``, ``concurrency`` requests at once; ``workers``: the
    ``hf-*`` scorers' processes at once (default one per core, at most 8)."""
    if batch < 1:
        raise RescoreError(f"--batch {batch}: write at least 1 re-score per transaction")
    if workers is not None and workers < 1:
        raise RescoreError(f"--workers {workers}: run at least 1 scoring process (default: one per core)")
    if scorer not in SCORERS:
        raise RescoreError(f"--scorer {scorer!r} unknown: use one of {', '.join(SCORERS)}")
    served = scorer == served_scorer.SERVED_SCORER
    if served and bool(engines) == bool(proxy):
        raise RescoreError("the vllm-served scorer asks a server of the version: pass --engine URL (repeatable) or "
                           "--proxy URL (whose active version it is), one of the two")
    if not served and (engines or proxy):
        raise RescoreError(f"--engine / --proxy are for --scorer {served_scorer.SERVED_SCORER}; --scorer {scorer} "
                           "scores the checkpoint folder on this machine")
    if served and concurrency < 1:
        raise RescoreError(f"--concurrency {concurrency}: send at least 1 request at a time")
    row = _version(store, version)
    path = None if served else _checkpoint(row, version, checkpoint)
    if path is not None and python is None:
        raise RescoreError(f"--scorer {scorer} runs a python with torch and transformers: pass --python")
    sel = select(store, where=where, export_id=export_id, rollout_id=rollout_id)
    res = RescoreResult(version, scorer)
    todo: list[TokenCall] = []
    for i in range(0, len(sel.rollout_ids), READ_ROLLOUTS):
        for calls in store.token_calls(sel.rollout_ids[i:i + READ_ROLLOUTS]).values():
            calls = [c for c in calls if sel.call_ids is None or c.id in sel.call_ids]
            res.selected_calls += len(calls)
            todo += [c for c in calls if _eligible(c, res.skipped)]
    have = rescored_call_ids(store, version, scorer, [c.id for c in todo])
    res.already = len(have)
    todo = [c for c in todo if c.id not in have]
    if limit is not None:
        todo = todo[:limit]
    say = progress or (lambda _: None)
    if served and todo:   # a run with nothing left to score asks no server
        engine = (served_scorer.from_proxy(proxy, admin_token, version, row.get("model_name"), served_model)
                  if proxy else served_scorer.connect(engines, version, row.get("model_name"), served_model))
        res.lineage = {**engine.lineage, "checkpoint_hash": row.get("checkpoint_hash")}
    elif not served:
        res.lineage = {"checkpoint_id": str(path), "checkpoint_hash": row.get("checkpoint_hash"),
                       "weights_sha256": weights_sha256(path), "scorer": scorer}
    say(f"{sel.what}: {res.selected_calls} calls, {res.already} already re-scored under {version} by {scorer}, "
        f"{len(todo)} to score ({sum(res.skipped.values())} skipped: {res.skipped or 'none'})")
    if not todo:
        return res
    t0 = time.monotonic()
    try:
        if served:
            _run_served(engine, todo, Sink(store, res, todo, batch, say, engine.check), concurrency)
        else:
            run_workers(python, path, HF_SCORERS[scorer], todo, res, Sink(store, res, todo, batch, say), timeout_s,
                        default_workers() if workers is None else workers)
    finally:
        res.seconds = time.monotonic() - t0
    return res


def _run_served(engine: served_scorer.Served, todo: Sequence[TokenCall], sink: Sink, concurrency: int) -> None:
    try:
        for call, logprobs in served_scorer.scores(engine, todo, concurrency):
            sink.add(call, logprobs)
    except RescoreError as exc:
        sink.write()   # what was scored before the error is good (a refused batch is gone): a run again resumes after it
        raise RescoreError(f"{exc} ({sink.res.written} re-scores were stored; a run again resumes after them)") \
            from None
    sink.write()
