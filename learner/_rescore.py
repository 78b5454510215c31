"""``learner.rescore``: teacher-forced logprobs of stored completions under a policy version, kept in the store.

The calls come from the store's token ids (``Store.token_calls``: the prompt ids and completion ids the engine
reported, never re-tokenized); the version's checkpoint folder is scored by a scorer from :data:`SCORERS`. The one
here, ``hf-float32`` (``hf-bfloat16``), is the Hugging Face model on the CPU, run by ``rescore_step.py`` in an
environment with torch and transformers (the vLLM CPU one for ``openforge rescore``). Results land in the store's
append-only ``rescores`` table keyed by (call, version, scorer), a batch at a time as they come: a re-score run
again writes nothing, and one that was killed resumes with the calls it had not stored.

Not here yet: scoring through a served engine's ``prompt_logprobs`` (the at-scale scorer, through the proxy's engine
replicas); its name would be registered in :data:`SCORERS` beside ``hf``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from forge_store import RescoreRow, Store, TokenCall, record_rescores, rescored_call_ids

from ._export_config import where_row
from ._query import parse_where

STEP_SCRIPT = Path(__file__).with_name("rescore_step.py")
SCORERS = {"hf-float32": "float32", "hf-bfloat16": "bfloat16"}   # scorer name -> the step's --dtype
READ_ROLLOUTS = 200    # rollouts whose calls are read at once
FLUSH_CALLS = 32       # re-scores written per transaction (what a kill can lose)


class RescoreError(ValueError):
    """A re-score that cannot run as asked; the message says which value and what to do."""


@dataclass
class Selection:
    rollout_ids: list[str]
    call_ids: set[str] | None = None   # None: every call of those rollouts
    what: str = "every rollout"


@dataclass
class RescoreResult:
    version: str
    scorer: str
    selected_calls: int = 0
    already: int = 0
    scored_calls: int = 0
    written: int = 0
    tokens: int = 0
    seconds: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)
    lineage: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict:
        return {"version": self.version, "scorer": self.scorer, "selected_calls": self.selected_calls,
                "already_scored": self.already, "scored_calls": self.scored_calls, "written": self.written,
                "tokens": self.tokens, "seconds": round(self.seconds, 2), "tokens_per_s": round(self.tokens_per_s, 1),
                "skipped": self.skipped, "lineage": self.lineage}


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


def _version(store: Store, version: str, checkpoint: Path | None) -> tuple[dict, Path]:
    rows = {r["id"]: r for r in store.lineage("policy_versions")}
    if version not in rows:
        raise RescoreError(f"--version {version!r} is not a policy version in the store; known: "
                           f"{', '.join(rows) or '(none)'}")
    row = rows[version]
    path = checkpoint or (Path(row["checkpoint_id"]) if row.get("checkpoint_id") else None)
    if path is None or not (path / "config.json").is_file():
        raise RescoreError(f"policy version {version!r} has no checkpoint folder on this machine (checkpoint_id "
                           f"{row.get('checkpoint_id')!r}); pass --checkpoint DIR with its Hugging Face weights")
    return row, path


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


def rescore(store: Store, version: str, *, python: Path, scorer: str = "hf-float32", where: str | None = None,
            export_id: str | None = None, rollout_id: str | None = None, checkpoint: Path | None = None,
            limit: int | None = None, batch: int = FLUSH_CALLS, timeout_s: float = 6 * 3600,
            progress: Callable[[str], None] | None = None) -> RescoreResult:
    """Re-score the selected calls under ``version`` and store what was not stored yet. ``limit``: at most that
    many calls this run (the rest wait for the next: a re-score resumes); ``batch``: re-scores written per
    transaction (what a kill can lose)."""
    if batch < 1:
        raise RescoreError(f"--batch {batch}: write at least 1 re-score per transaction")
    if scorer not in SCORERS:
        raise RescoreError(f"--scorer {scorer!r} unknown: use one of {', '.join(SCORERS)}")
    row, path = _version(store, version, checkpoint)
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
    sha = weights_sha256(path)
    res.lineage = {"checkpoint_id": str(path), "checkpoint_hash": row.get("checkpoint_hash"), "weights_sha256": sha,
                   "scorer": scorer}
    say = progress or (lambda _: None)
    say(f"{sel.what}: {res.selected_calls} calls, {res.already} already re-scored under {version} by {scorer}, "
        f"{len(todo)} to score ({sum(res.skipped.values())} skipped: {res.skipped or 'none'})")
    if not todo:
        return res
    t0 = time.monotonic()
    _run(python, path, SCORERS[scorer], todo, res, store, version, scorer, timeout_s, say, batch)
    res.seconds = time.monotonic() - t0
    return res


def _run(python: Path, model: Path, dtype: str, todo: Sequence[TokenCall], res: RescoreResult, store: Store,
         version: str, scorer: str, timeout_s: float, say: Callable[[str], None], flush: int) -> None:
    by_id = {c.id: c for c in todo}
    total_tokens = sum(len(c.completion) // 4 for c in todo)
    with tempfile.TemporaryDirectory(prefix="openforge-rescore-") as tmp:
        path = Path(tmp) / "calls.jsonl"
        with open(path, "w") as f:
            for c in sorted(todo, key=lambda c: (c.rollout_id, c.seq)):
                f.write(json.dumps({"call_id": c.id, "rollout_id": c.rollout_id, "prompt_ids": c.prompt_token_ids,
                                    "completion_ids": c.completion_token_ids}) + "\n")
        with open(Path(tmp) / "stderr", "w+") as err:
            proc = subprocess.Popen([str(python), str(STEP_SCRIPT), "--model", str(model), "--calls", str(path),
                                     "--dtype", dtype], stdout=subprocess.PIPE, stderr=err, text=True)
            timer = threading.Timer(timeout_s, proc.kill)
            timer.start()
            batch: list[RescoreRow] = []
            t0, last = time.monotonic(), 0.0
            try:
                for line in proc.stdout:
                    msg = json.loads(line)
                    if "lineage" in msg:
                        res.lineage.update(msg["lineage"])
                        continue
                    c = by_id[msg["call_id"]]
                    if len(msg["logprobs"]) != len(c.completion) // 4:
                        raise RescoreError(f"the scorer gave {len(msg['logprobs'])} logprobs for call {c.id}'s "
                                           f"{len(c.completion) // 4} completion tokens")
                    batch.append(RescoreRow(c.id, c.rollout_id, version, scorer, dict(res.lineage), msg["logprobs"]))
                    res.scored_calls += 1
                    res.tokens += len(msg["logprobs"])
                    if len(batch) >= flush:
                        res.written += record_rescores(store, batch)
                        batch = []
                        say(f"stored {res.written} re-scores")
                    now = time.monotonic() - t0
                    if now - last >= 5 or res.scored_calls == len(todo):
                        last = now
                        rate = res.tokens / now if now else 0.0
                        left = (total_tokens - res.tokens) / rate if rate else 0.0
                        say(f"{res.scored_calls}/{len(todo)} calls, {res.tokens:,}/{total_tokens:,} tokens, "
                            f"{rate:,.0f} tokens/s, ~{left:.0f} s left")
                res.written += record_rescores(store, batch)
                rc = proc.wait()
            finally:
                timer.cancel()
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            err.seek(0)
            tail = err.read()[-3000:]
    if rc != 0:
        raise RescoreError(f"the re-score step failed (exit {rc}{', killed after ' + str(timeout_s) + ' s' if rc < 0 else ''}"
                           f"); {res.written} re-scores were stored and a run again resumes after them:\n{tail}")
