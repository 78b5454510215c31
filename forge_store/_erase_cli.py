"""``openforge erase`` and ``openforge store retain``: the erasure machinery (``forge_store._erase``) on the command
line. Both are dry runs unless given ``--yes``: they print what would go, then do nothing."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from ._erase import ErasureReport, erase
from ._erase_select import KEEPS, Selection
from ._errors import InvalidRecord, StoreError
from ._settings import get_settings
from ._write.journal_files import JournalError

console = Console()
err = Console(stderr=True)

StoreOpt = Annotated[Optional[str], typer.Option("--store", help="Store URL (default: OPENFORGE_STORE_URL or "
                                                  "the SQLite file under OPENFORGE_HOME).", show_default=False)]
Multi = Optional[list[str]]


def _fail(exc: object) -> None:
    err.print(f"[bold red]error:[/] {exc}", highlight=False)
    raise typer.Exit(2)


def _when(value: str | None, flag: str) -> datetime | None:
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        _fail(f"{flag} {value!r} is not a date: write an ISO date or time, e.g. 2026-01-31 or 2026-01-31T12:00")
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def parse_age(value: str) -> timedelta:
    """``90d``, ``12h``, ``30m``, ``2w`` -> a timedelta."""
    m = re.fullmatch(r"\s*(\d+)\s*([wdhm])\s*", value)
    if not m:
        raise InvalidRecord(f"--older-than {value!r}: write a number and a unit: 90d (days), 2w, 12h or 30m")
    n, unit = int(m.group(1)), m.group(2)
    return {"w": timedelta(weeks=n), "d": timedelta(days=n), "h": timedelta(hours=n), "m": timedelta(minutes=n)}[unit]


def _run(store: str | None, sel: Selection, *, reason: str, yes: bool, shards: bool, copies: tuple[str, ...],
         by: str | None) -> None:
    from ._store import open_store

    try:
        st = open_store(store or get_settings().resolved_store_url())
    except (StoreError, JournalError) as exc:
        _fail(exc)
    try:
        report = erase(st, sel, reason=reason, actor=by, apply=yes, shards=shards, extra_copies=copies)
    except (StoreError, JournalError) as exc:
        _fail(exc)
    finally:
        st.close()
    _print(report, yes, shards)


def _print(r: ErasureReport, applied: bool, shards: bool) -> None:
    for tid in r.resumed:
        console.print(f"finished erasure {tid}, left unfinished by an earlier run", highlight=False)
    table = Table(title=("erased" if applied else "would erase (dry run: pass --yes to erase)")
                  + (f" - tombstone {r.tombstone_id}" if r.tombstone_id else ""))
    table.add_column("what")
    table.add_column("count", justify="right")
    for k, v in r.counts.items():
        table.add_row(k, f"{v:,}")
    console.print(table)
    if r.counts.get("running"):
        err.print(f"[yellow]warning:[/] {r.counts['running']} of the rollouts had not finished: a harness still "
                  "running records its later calls again. End them first (POST /admin/rollouts/ID/end, or stop the "
                  "run), then run this again", highlight=False)
    for c in r.copies:
        rows = c.get("rows")
        state = ("not found" if rows is None else f"{rows:,} rows removed") if applied else "will be cleaned"
        console.print(f"{c['kind']} {c['url']}: {state}", highlight=False)
    for s in r.shards:
        what = "deleted" if s.get("deleted") else ("kept: pass --shards to delete it" if not shards else
                                                  "not found")
        console.print(f"export {s['export_id']} at {s['out_dir']} held erased rollouts ({what}); its `export "
                      "verify` now fails naming this erasure", highlight=False)


def erase_command(
    rollout: Multi = typer.Option(None, "--rollout", help="A rollout id (repeatable)."),
    task: Multi = typer.Option(None, "--task", help="A task id (repeatable); alone, the task's rows go too."),
    harness: Multi = typer.Option(None, "--harness", help="A harness id or name (repeatable)."),
    policy_version: Multi = typer.Option(None, "--policy-version", help="A policy version id (repeatable)."),
    since: Optional[str] = typer.Option(None, "--since", help="Rollouts started at or after (ISO date, UTC)."),
    until: Optional[str] = typer.Option(None, "--until", help="Rollouts started before (ISO date, UTC)."),
    pattern: Optional[str] = typer.Option(None, "--pattern", help="Every rollout any of whose calls (or own text) "
                                          "contains this text; prefer --pattern-file, which keeps it out of argv."),
    pattern_file: Optional[typer.FileText] = typer.Option(None, "--pattern-file", help="Read the pattern from this "
                                                          "file ('-': stdin; one line, its newline dropped)."),
    reason: str = typer.Option(..., "--reason", help="Why (kept in the tombstone): a leaked key, a licence "
                               "withdrawn, an opt-out."),
    by: Optional[str] = typer.Option(None, "--by", help="Who asks (default: the OS user)."),
    yes: bool = typer.Option(False, "--yes", help="Erase (without it: a dry run that only counts)."),
    shards: bool = typer.Option(False, "--shards", help="Also delete the exported shards that held erased rows."),
    copy: Multi = typer.Option(None, "--copy", help="A snapshot or lake (folder or s3:// URL) the store did not "
                               "record, to clean too (repeatable)."),
    store: StoreOpt = None,
) -> None:
    """Remove a selection from every copy (rows, shared messages and blobs nothing kept references, journals and
    dead letters, snapshots, lake partitions) and leave a tombstone. Criteria combine with AND. Killed half-way,
    run it again: it finishes first what was left."""
    if pattern_file is not None:
        pattern = pattern_file.read().rstrip("\n")
    try:
        sel = Selection(rollouts=tuple(rollout or ()), tasks=tuple(task or ()), harnesses=tuple(harness or ()),
                        policy_versions=tuple(policy_version or ()), since=_when(since, "--since"),
                        until=_when(until, "--until"), pattern=pattern)
    except InvalidRecord as exc:
        _fail(exc)
    _run(store, sel, reason=reason, yes=yes, shards=shards, copies=tuple(copy or ()), by=by)


def retain_command(
    older_than: str = typer.Option(..., "--older-than", help="Erase rollouts started longer ago than this: 90d, "
                                   "2w, 12h."),
    keep: Multi = typer.Option(None, "--keep", help=f"Keep these even when old (repeatable): {', '.join(KEEPS)}."),
    yes: bool = typer.Option(False, "--yes", help="Erase (without it: a dry run that only counts)."),
    shards: bool = typer.Option(False, "--shards", help="Also delete the exported shards that held erased rows."),
    store: StoreOpt = None,
) -> None:
    """Retention: erase every rollout older than --older-than (through `openforge erase`'s machinery, with a
    tombstone), except what --keep names. A dry run unless --yes; a cron line runs it as a standing policy."""
    try:
        age = parse_age(older_than)
        sel = Selection(until=datetime.now(timezone.utc) - age, keep=tuple(keep or ()))
    except InvalidRecord as exc:
        _fail(exc)
    keeps = f", keeping {', '.join(sel.keep)}" if sel.keep else ""
    _run(store, sel, reason=f"retention: older than {older_than}{keeps}", yes=yes, shards=shards, copies=(),
         by="retention")
