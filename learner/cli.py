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
