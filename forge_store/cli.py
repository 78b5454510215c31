"""The ``openforge`` command line: one group per part of the architecture.

Errors of the store become one red line (value, rule, fix) and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import migrate
from .engine import create_engine, redact_url
from .errors import StoreError
from .journal import JournalError
from .settings import get_settings

app = typer.Typer(help="OpenForge: record agent rollouts token-exactly and turn them into RL training data.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
db_app = typer.Typer(help="Schema migrations of the lineage store.", no_args_is_help=True)
store_app = typer.Typer(help="Inspect, snapshot and drain the lineage store.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(store_app, name="store")

def _register_parts() -> None:
    """Commands of the other parts; each module defers its heavy imports until its command runs."""
    from learner.analyze_cli import analysis_app
    from learner.cli import export_app, train_command
    from proxy.cli import proxy_command
    from rollout.cli import demo_command, run_command

    app.command("proxy")(proxy_command)
    app.add_typer(export_app, name="export")
    app.add_typer(analysis_app)  # analyze, sql, dashboard
    app.command("run")(run_command)
    app.command("demo")(demo_command)
    app.command("train")(train_command)


_register_parts()

console = Console()
err = Console(stderr=True)

StoreOpt = Annotated[Optional[str], typer.Option("--store", help="Store URL (default: OPENFORGE_STORE_URL or "
                                                  "the SQLite file under OPENFORGE_HOME).", show_default=False)]


def _fail(exc: Exception) -> None:
    err.print(f"[bold red]error:[/] {exc}", highlight=False)
    raise typer.Exit(2)


def _url(store: str | None) -> str:
    return store or get_settings().resolved_store_url()


@db_app.command("upgrade")
def db_upgrade(store: StoreOpt = None, revision: str = typer.Option("head", help="Target revision.")) -> None:
    """Create or migrate the schema up to REVISION (default: head)."""
    url = _url(store)
    try:
        engine = create_engine(url)
        before = migrate.current(engine)
        migrate.upgrade(engine, revision)
        console.print(f"{redact_url(url)}: {before or '(empty)'} -> {migrate.current(engine)}")
    except StoreError as exc:
        _fail(exc)


@db_app.command("downgrade")
def db_downgrade(revision: str = typer.Argument(..., help="Target revision ('base' drops every table)."),
                 store: StoreOpt = None) -> None:
    """Migrate the schema down to REVISION."""
    url = _url(store)
    try:
        engine = create_engine(url)
        before = migrate.current(engine)
        migrate.downgrade(engine, revision)
        console.print(f"{redact_url(url)}: {before} -> {migrate.current(engine) or '(empty)'}")
    except StoreError as exc:
        _fail(exc)


@db_app.command("current")
def db_current(store: StoreOpt = None) -> None:
    """Print the database's migration revision and this code's head."""
    url = _url(store)
    try:
        rev = migrate.current(create_engine(url))
    except StoreError as exc:
        _fail(exc)
    head = ", ".join(migrate.heads())
    state = "up to date" if rev in migrate.heads() else ("empty" if rev is None else "needs `openforge db upgrade`")
    console.print(f"{redact_url(url)}: revision {rev or '(none)'}; head {head} ({state})")


def _open(store: str | None, **kw):
    from .store import open_store

    try:
        return open_store(_url(store), **kw)
    except (StoreError, JournalError) as exc:
        _fail(exc)


@store_app.command("info")
def store_info(store: StoreOpt = None, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Store id, watermark and row counts of every table."""
    st = _open(store)
    try:
        info = {"url": st.url, "store_id": st.store_id, "watermark": st.watermark(), "rows": st.counts()}
    finally:
        st.close()
    if as_json:
        console.print_json(json.dumps(info))
        return
    table = Table(title=f"{info['url']}  store {info['store_id']}  watermark {info['watermark']}")
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name, n in info["rows"].items():
        table.add_row(name, f"{n:,}")
    console.print(table)


@store_app.command("snapshot")
def store_snapshot(out: Path = typer.Option(..., "--out", help="Folder for the Parquet files and manifest.json."),
                   store: StoreOpt = None,
                   as_of: Optional[int] = typer.Option(None, "--as-of", help="Watermark to pin (default: current).")) -> None:
    """Write every table as Parquet (readable with DuckDB), pinned to a watermark."""
    from .snapshot import snapshot

    st = _open(store)
    try:
        totals = st.counts()
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err) as bar:
            tasks = {}

            def progress(table: str, n: int) -> None:
                if table not in tasks:
                    tasks[table] = bar.add_task(table, total=totals.get(table) or None)
                bar.advance(tasks[table], n)

            manifest = snapshot(st.engine, out, as_of=as_of, progress=progress)
    finally:
        st.close()
    rows = sum(t["rows"] for t in manifest["tables"].values())
    console.print(f"wrote {len(manifest['tables'])} tables, {rows:,} rows at watermark {manifest['watermark']} to {out}")


@store_app.command("drain")
def store_drain(name: str = typer.Option("default", help="Journal name (one per writing process)."),
                store: StoreOpt = None, timeout: float = typer.Option(60.0, help="Seconds to wait for the database.")) -> None:
    """Replay a journal left behind by a stopped writer (e.g. a killed proxy) into the database."""
    st = _open(store, journal=True, name=name)
    try:
        ok = st.flush(timeout)
    finally:
        st.close(timeout=1.0)
    if not ok:
        _fail(StoreError(f"journal {name!r} did not drain within {timeout}s: is the database reachable? "
                         "Nothing was lost; run this again when it is."))
    console.print(f"journal {name!r} drained into {redact_url(_url(store))}")


def main() -> None:  # pragma: no cover - console script entry
    app()
