"""The store's commands: ``openforge db`` (migrations), ``openforge store`` (info, snapshot, lake, drain, check-calls),
``openforge sql``.

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

from . import _migrate as migrate
from ._engine import create_engine, redact_url
from ._errors import StoreError
from ._settings import get_settings
from ._tables import print_table
from ._write.journal_files import JournalError, JournalLocked
from ._write.journal_tail import JournalTail

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
    print_table(console, f"{info['url']}  store {info['store_id']}  watermark {info['watermark']}",
                [{"table": name, "rows": f"{n:,}"} for name, n in info["rows"].items()], right=("rows",))


@store_app.command("snapshot")
def store_snapshot(out: str = typer.Option(..., "--out", "--to", help="Folder or s3://BUCKET/PREFIX for the Parquet "
                                           "files and manifest.json (credentials: OPENFORGE_S3_* or AWS_*)."),
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

            manifest = snapshot(st.engine, out, as_of=as_of, progress=progress, settings=st.settings)
    except StoreError as exc:
        _fail(exc)
    finally:
        st.close()
    rows = sum(t["rows"] for t in manifest["tables"].values())
    console.print(f"wrote {len(manifest['tables'])} tables, {rows:,} rows at watermark {manifest['watermark']} to {out}")


@store_app.command("lake")
def store_lake(to: str = typer.Option(..., "--to", help="The lake: a folder or s3://BUCKET/PREFIX (credentials: "
                                      "OPENFORGE_S3_* or AWS_*). See docs/data-lake.md."),
               store: StoreOpt = None,
               as_of: Optional[int] = typer.Option(None, "--as-of", help="Watermark to run to (default: current).")
               ) -> None:
    """Add the rows written since the lake's last snapshot as new Parquet partitions (old ones are never rewritten)."""
    from ._lake import lake_snapshot

    st = _open(store)
    try:
        m = lake_snapshot(st.engine, to, as_of=as_of, settings=st.settings)
    except StoreError as exc:
        _fail(exc)
    finally:
        st.close()
    rows = sum(t["rows"] for t in m["tables"].values())
    console.print(f"lake {to}: watermark {m['from_watermark']} -> {m['to_watermark']}, {rows:,} rows in "
                  f"{m['partition']}")


def _journals(name: str | None) -> tuple[Path, list[str | None]]:
    """The journal folder and the journals in it to drain: ``name``'s, or every one left there (None: the one
    folder ``OPENFORGE_JOURNAL_DIR`` names, which every writer shares)."""
    settings = get_settings()
    if settings.journal_dir is not None:
        return settings.journal_dir, [None]
    root = settings.home / "journal"
    if name is not None:
        if not (root / name).is_dir():
            known = ", ".join(_journal_names(root)) or "none"
            _fail(f"no journal named {name!r} under {root} (journals there: {known}); drop --name to drain them all")
        return root, [name]
    return root, _journal_names(root)


def _journal_names(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (
        (p / "CHECKPOINT").exists() or (p / "LOCK").exists() or any(p.glob("*.log"))))


@store_app.command("drain")
def store_drain(name: Optional[str] = typer.Option(None, help="Drain only this journal (default: every journal "
                                                   "under the journal folder; the proxy's is 'proxy')."),
                store: StoreOpt = None, timeout: float = typer.Option(60.0, help="Seconds to wait for the database, "
                                                                      "per journal.")) -> None:
    """Replay the journals left behind by stopped writers (a killed proxy, say) into the database, every one under
    the journal folder (OPENFORGE_HOME/journal), naming each with how many operations it held."""
    from ._store import open_store

    root, names = _journals(name)
    if not names:
        console.print(f"no journal under {root}: nothing to drain")
        return
    problems = []
    for jname in names:
        label = repr(jname) if jname is not None else str(root)
        try:
            st = open_store(_url(store), journal=True, name=jname or "default")
        except JournalLocked as exc:
            problems.append(f"journal {label} is in use by a running writer, which drains it itself ({exc})")
            continue
        except (StoreError, JournalError) as exc:
            _fail(exc)
        try:
            ok = st.flush(timeout)
            status = st.writer_status()
        finally:
            st.close(timeout=1.0)
        if not ok:
            problems.append(f"journal {label}: {status['pending_ops']:,} operations not drained within {timeout}s: "
                            "is the database reachable? Nothing was lost; run this again when it is")
            continue
        dead_dir = (root if jname is None else root / jname) / "dead-letter"
        dead = len(list(dead_dir.glob("*.msgpack"))) if dead_dir.is_dir() else 0
        note = f"; {dead:,} refused operations kept in {dead_dir} (dead letters)" if dead else ""
        console.print(f"journal {label}: drained {status['applied_ops']:,} operations into "
                      f"{redact_url(_url(store))}{note}", highlight=False)
    if problems:
        _fail("; ".join(problems))


@store_app.command("check-calls")
def store_check_calls(ids: Path = typer.Argument(..., help="File with one call id per line ('-': stdin), e.g. "
                                                 "the X-OpenForge-Call-Id headers your clients received."),
                      store: StoreOpt = None) -> None:
    """Say which of the call ids in IDS are not in the store (exit 1 if any): after a crash and `openforge store
    drain`, every call a client was answered is there exactly once (call ids are the calls' keys)."""
    import sys

    text = sys.stdin.read() if str(ids) == "-" else ids.read_text()
    wanted = list(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))
    st = _open(store)
    try:
        found = st.known_call_ids(wanted)
    finally:
        st.close()
    missing = [i for i in wanted if i not in found]
    root = get_settings().home / "journal"
    behind = [n for n in _journal_names(root) if JournalTail(root / n).read(1)]  # records not yet in the database
    console.print(f"{len(wanted) - len(missing):,} of {len(wanted):,} call ids are in the store", highlight=False)
    if missing:
        hint = (f" (journals under {root} still hold records: {', '.join(behind)}; run `openforge store drain` "
                "first)") if behind else ""
        err.print(f"missing: {' '.join(missing[:50])}{' ...' if len(missing) > 50 else ''}{hint}", highlight=False)
        raise typer.Exit(1)


@store_app.command("add-reward")
def store_add_reward(
    rollout: str = typer.Argument(..., help="The rollout's id."),
    value: float = typer.Option(..., "--value", help="The reward: a finite number."),
    source: str = typer.Option("api", "--source", help="Who graded it: verifier, judge, human or api."),
    verifier_version: Optional[str] = typer.Option(None, "--verifier-version", help="The grader's version."),
    evidence_file: Optional[Path] = typer.Option(None, "--evidence-file", help="A file kept as the reward's "
                                                 "evidence blob (a verifier's log, a judge's reasoning)."),
    reward_id: Optional[str] = typer.Option(None, "--id", help="The reward's id: the same command run twice "
                                            "adds it once."),
    store: StoreOpt = None,
) -> None:
    """Append a reward to ROLLOUT (rollouts another orchestrator recorded through the proxy and graded elsewhere).
    Append-only: a later reward is a new row, and the latest one counts."""
    import math

    from ._errors import NotFound
    from ._records import REWARD_SOURCES

    if not math.isfinite(value):
        _fail(f"--value {value}: a reward is a finite number; a grader that could not score is an infra error "
              "(an exclusion), not a reward")
    if source not in REWARD_SOURCES:
        _fail(f"--source {source!r}: a reward's source is one of {', '.join(REWARD_SOURCES)}; pick one")
    try:
        evidence = evidence_file.read_bytes() if evidence_file is not None else None
    except OSError as exc:
        _fail(f"--evidence-file {evidence_file}: cannot read it ({exc.strerror}); pass a readable file")
    st = _open(store)
    try:
        try:
            st.rollout(rollout)
        except NotFound:
            _fail(f"rollout {rollout!r} is not in {redact_url(st.url)}; check the id (a proxy's rollouts arrive "
                  "when its journal drains: `openforge store drain`)")
        blob = st.put_blob(evidence, "text/plain") if evidence is not None else None
        rid = st.add_reward(rollout, value, source=source, verifier_version=verifier_version, evidence_blob=blob,
                            id=reward_id)
        st.flush(30)
    except StoreError as exc:
        _fail(exc)
    finally:
        st.close()
    console.print(f"reward {rid}: {value:g} ({source}) for rollout {rollout}"
                  + (f", evidence blob {blob}" if blob else ""), highlight=False)


def sql_command(
    query: str = typer.Argument(..., help="DuckDB SQL over the views rollouts, calls, tool_calls, rewards, samples, "
                                          "exclusions, exports, tasks, harnesses, policy_versions."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL, a snapshot folder or an s3://BUCKET/PREFIX "
                                        "snapshot (reached with OPENFORGE_S3_* / AWS_*; default: the configured "
                                        "store).", show_default=False),
    max_rows: int = typer.Option(200, "--max-rows", help="Print at most this many rows."),
    csv: Optional[Path] = typer.Option(None, "--csv", help="Write the full result to this CSV file."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows (at most --max-rows) as a JSON list of "
                                 "objects."),
) -> None:
    """Run DuckDB SQL over the store (read-only) or a Parquet snapshot (a folder or an s3:// URL)."""
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
    records = [dict(zip(cols, row)) for row in rows[:max_rows]]
    if as_json:
        print(json.dumps(records, default=str))
    else:
        print_table(console, None, records)
    if len(rows) > max_rows:
        err.print(f"(more than {max_rows} rows; pass --max-rows or --csv FILE for all)")


def _retain() -> None:
    from ._erase_cli import retain_command

    store_app.command("retain")(retain_command)


_retain()
