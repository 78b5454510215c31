"""``openforge analyze``, ``openforge sql`` and ``openforge dashboard``: behaviour analysis over the store.

Registered by ``forge_store.cli._register_parts``; heavy imports wait until a command runs. Every command opens the
store read-only (an empty database is reported, never given a schema).
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

analysis_app = typer.Typer()
console, err = Console(), Console(stderr=True)
StoreOpt = typer.Option(None, "--store", help="Store URL (default: OPENFORGE_STORE_URL or the SQLite file under "
                                              "OPENFORGE_HOME).", show_default=False)


def _fail(msg: object, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code)


def _url(store: str | None) -> str:
    from forge_store import get_settings

    return store or get_settings().resolved_store_url()


def _open(store: str | None):
    from forge_store import StoreError, get_settings, open_store

    try:
        return open_store(_url(store), settings=get_settings(auto_upgrade=False))
    except StoreError as exc:
        _fail(exc)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def print_table(out: Console, title: str, rows: list[dict], *, transpose: bool = False) -> None:
    """One report table; ``transpose`` with up to three slices puts one metric per row, to fit a terminal."""
    if not rows:
        out.print(f"[dim]{title}: nothing yet[/]")
        return
    cols = list(rows[0])
    table = Table(title=title, title_justify="left")
    if transpose and len(rows) <= 3:
        table.add_column(cols[0])
        for row in rows:
            table.add_column(_fmt(row[cols[0]]), justify="right", overflow="fold")
        for metric in cols[1:]:
            table.add_row(metric, *(_fmt(row.get(metric)) for row in rows))
    else:
        for col in cols:
            table.add_column(col, justify="left" if isinstance(rows[0][col], str) else "right", overflow="fold")
        for row in rows:
            table.add_row(*(_fmt(row.get(c)) for c in cols))
    out.print(table)


def _print(title: str, rows: list[dict]) -> None:
    if rows:
        print_table(Console(), title, rows)   # a console made now reads the terminal width (COLUMNS) now


def _write(rows_by_name: dict[str, list[dict]], out: Path, kind: str) -> None:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    for name, rows in rows_by_name.items():
        table = pa.Table.from_pylist(rows) if rows else pa.table({})
        if kind == "csv":
            pcsv.write_csv(table, out / f"{name}.csv")
        else:
            pq.write_table(table, out / f"{name}.parquet")
    console.print(f"wrote {', '.join(f'{n}.{kind}' for n in rows_by_name)} to {out}")


@analysis_app.command("analyze")
def analyze_command(
    store: Optional[str] = StoreOpt,
    by: str = typer.Option("policy_version", "--by", help="Slice by policy_version | harness | domain."),
    k: list[int] = typer.Option([1, 5], "--k", help="pass@k / pass^k for these k (repeat: --k 1 --k 5)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only rollouts started on or after this date (YYYY-MM-DD)."),
    config: Optional[Path] = typer.Option(None, "--config", help="Rubric rules as TOML (see learner/analysis_config.py)."),
    csv: Optional[Path] = typer.Option(None, "--csv", help="Also write every table as CSV into this folder."),
    parquet: Optional[Path] = typer.Option(None, "--parquet", help="Also write every table as Parquet into this folder."),
) -> None:
    """Behaviour rubrics, pass@k / pass^k, latency, timeout / infra-error / exclusion rates per slice."""
    from .analysis import SLICES, AnalysisError, analyze
    from .analysis_config import RubricConfig, RubricConfigError

    if by not in SLICES:
        _fail(f"--by {by!r}: slice by one of {', '.join(SLICES)}")
    start = None
    if since:
        try:
            start = datetime.fromisoformat(since).replace(tzinfo=timezone.utc)
        except ValueError:
            _fail(f"--since {since!r} is not a date: write it as YYYY-MM-DD")
    try:
        cfg = RubricConfig.from_toml(config) if config else RubricConfig()
    except RubricConfigError as exc:
        _fail(exc)
    st = _open(store)
    try:
        report = analyze(st, by=by, ks=tuple(k), config=cfg, since=start)
    except AnalysisError as exc:
        _fail(exc)
    finally:
        st.close()
    if not report["summary"]:
        _fail(f"{st.url} has no finished rollouts{' since ' + since if since else ''}: nothing to analyze. Record "
              "rollouts first, or point --store at another store.", code=1)
    _print(f"Outcomes by {by}", report["summary"])
    _print(f"Behaviour by {by}", report["behaviour"])
    _print(f"Tool-call share by category and {by}", report["categories"])
    _print(f"Exclusions by reason and {by}", report["exclusions"])
    if csv:
        _write(report, csv, "csv")
    if parquet:
        _write(report, parquet, "parquet")


@analysis_app.command("sql")
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

    from forge_store import StoreError
    from forge_store.duckdb_views import ANALYSIS_VIEWS, connect

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
        table.add_row(*(_fmt(v) for v in row))
    console.print(table)
    if len(rows) > max_rows:
        err.print(f"(more than {max_rows} rows; pass --max-rows or --csv FILE for all)")


@analysis_app.command("dashboard")
def dashboard_command(
    store: Optional[str] = StoreOpt,
    port: int = typer.Option(8501, "--port", help="HTTP port of the dashboard."),
    address: str = typer.Option("127.0.0.1", "--address", help="Address to listen on."),
) -> None:
    """Serve the Streamlit dashboards (overview, trajectories, behaviour, exports); read-only."""
    try:
        import streamlit  # noqa: F401
    except ImportError:
        _fail("streamlit is not installed: pip install 'openforge[dashboards]'")
    st = _open(store)  # fail here, with the store's own message, rather than inside the browser
    st.close()
    app = Path(__file__).resolve().parent.parent / "dashboards" / "app.py"
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(port), "--server.address", address,
           "--server.headless", "true", "--browser.gatherUsageStats", "false", "--", "--store", _url(store)]
    console.print(f"dashboard on http://{address}:{port} (Ctrl-C to stop)")
    try:
        raise typer.Exit(subprocess.call(cmd))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
