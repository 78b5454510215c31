"""The store's commands: ``openforge db`` (migrations), ``openforge store`` (info, snapshot, drain), ``openforge sql``.

Declared as entry points in ``pyproject.toml``; the root command (``openforge.cli``) discovers them. Errors of the
store become one red line (value, rule, fix) and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import _migrate as migrate
from ._engine import create_engine, redact_url
from ._errors import StoreError
from ._settings import get_settings
from ._write.journal_files import JournalError

db_app = typer.Typer(help="Schema migrations of the lineage store.", no_args_is_help=True)
store_app = typer.Typer(help="Inspect, snapshot and drain the lineage store.", no_args_is_help=True)

console = Console()
err = Console(stderr=True)

StoreOpt = Annotated[Optional[str], typer.Option("--store", help="Store URL (default: OPENFORGE_STORE_URL or "
                                                  "the SQLite file under OPENFORGE_HOME).", show_default=False)]


def _fail(exc: object) -> None:
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
    from ._store import open_store

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
    from ._snapshot import snapshot

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


def sql_command(
    query: str = typer.Argument(..., help="DuckDB SQL over the views rollouts, calls, tool_calls, rewards, samples, "
                                          "exclusions, exports, tasks, harnesses, policy_versions."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL or a snapshot folder (default: the "
                                        "configured store).", show_default=False),
    max_rows: int = typer.Option(200, "--max-rows", help="Print at most this many rows."),
    csv: Optional[Path] = typer.Option(None, "--csv", help="Write the full result to this CSV file."),
) -> None:
    """Run DuckDB SQL over the store (read-only) or a Parquet snapshot."""
    import duckdb

    from ._duckdb_views import ANALYSIS_VIEWS, connect

    try:
        con = connect(_url(store))
    except StoreError as exc:
        _fail(exc)
    try:
        rel = con.sql(query)
    except duckdb.Error as exc:
        _fail(f"{str(exc).splitlines()[0]}. The views are {', '.join(ANALYSIS_VIEWS)} (and store.<table> for every "
              "table); fix the query and retry.")
    if rel is None:
        console.print("ok")
        return
    if csv:
        rel.write_csv(str(csv))
        console.print(f"wrote {csv}")
        return
    cols, rows = rel.columns, rel.fetchmany(max_rows + 1)
    table = Table()
    for c in cols:
        table.add_column(c)
    for row in rows[:max_rows]:
        table.add_row(*("-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v) for v in row))
    console.print(table)
    if len(rows) > max_rows:
        err.print(f"(more than {max_rows} rows; pass --max-rows or --csv FILE for all)")
