"""``openforge tasks list | diff | validate``: task sets as versioned data (the ``tasks`` group in ``rollout/_cli.py``
registers them). Errors are one red line (value, rule, fix) and exit code 2; a validation that fails is exit 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from forge_store import print_table

from .._task import TaskError, load_tasks
from .._task_version import diff_versions, stored_version, task_version
from ._validate import validate_task

err = Console(stderr=True)


def _fail(message: object) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(2)


def _load(path: Path):
    try:
        return load_tasks(path)
    except TaskError as exc:
        _fail(exc)


def list_command(
    tasks: Optional[Path] = typer.Argument(None, help="A task folder or a folder of task folders."),
    store: Optional[str] = typer.Option(None, "--store", help="List the task versions recorded in this store "
                                        "instead (default store when no folder is given)."),
    json_out: bool = typer.Option(False, "--json", help="Print the versions as JSON on stdout."),
) -> None:
    """List task versions: each task's content address (instruction, task.toml, environment, tests, solution)."""
    if tasks is not None and store is not None:
        _fail("pass a task folder or --store URL, not both")
    if tasks is not None:
        rows = [{"task_id": t.id, "version": v.id, "domain": t.domain, "files": len(v.files),
                 "solution": v.solution_hash is not None, "source": v.source, "lineage": None}
                for t in _load(tasks) for v in [task_version(t)]]
    else:
        from forge_store import StoreError, open_store

        try:
            with open_store(store) as st:
                stored = st.lineage("task_versions")
        except StoreError as exc:
            _fail(exc)
        rows = [{"task_id": r["task_id"], "version": r["id"], "domain": (r["metadata"] or {}).get("domain"),
                 "files": len(r["files"]), "solution": r["solution_hash"] is not None, "source": r["source"],
                 "lineage": r["lineage"]} for r in stored]
    if json_out:
        print(json.dumps(rows, default=str))
        return
    print_table(Console(), f"{len(rows)} task version(s)",
                [{"task": r["task_id"], "version": r["version"][:12], "domain": str(r["domain"] or "-"),
                  "files": str(r["files"]), "solution": "yes" if r["solution"] else "no",
                  "origin": ((r["lineage"] or {}).get("generator", {}).get("run_id") if r["lineage"] else None)
                  or str(r["source"] or "-")} for r in rows], right=())


def diff_command(
    old: Path = typer.Argument(..., help="The earlier task set (a folder of task folders), or with --store the "
                               "later one."),
    new: Optional[Path] = typer.Argument(None, help="The later task set."),
    store: Optional[str] = typer.Option(None, "--store", help="Compare OLD against the versions this store last "
                                        "recorded for the same task ids (instead of a second folder)."),
    json_out: bool = typer.Option(False, "--json", help="Print the difference as JSON on stdout."),
) -> None:
    """What changed between two task sets: tasks added, removed, changed (which parts and files), unchanged."""
    if (new is None) == (store is None):
        _fail("pass two task folders (OLD NEW), or one folder and --store URL")
    if store is None:
        d = diff_versions([task_version(t) for t in _load(old)], [task_version(t) for t in _load(new)])
    else:
        from forge_store import StoreError, open_store

        folder = [task_version(t) for t in _load(old)]
        try:
            with open_store(store) as st:
                latest = {r["task_id"]: stored_version(r) for r in st.lineage("task_versions")}  # ingest order
        except StoreError as exc:
            _fail(exc)
        ids = {v.task_id for v in folder}
        d = diff_versions([v for tid, v in latest.items() if tid in ids], folder)
    if json_out:
        print(json.dumps(d))
        return
    out = Console(soft_wrap=True)
    for tid in d["added"]:
        out.print(f"+ {tid}", highlight=False)
    for tid in d["removed"]:
        out.print(f"- {tid}", highlight=False)
    for c in d["changed"]:
        out.print(f"~ {c['task_id']} {c['from'][:12]} -> {c['to'][:12]} ({', '.join(c['parts'])}): "
                  + ", ".join(f"{p} {how}" for p, how in c["files"].items()), highlight=False)
    out.print(f"{len(d['added'])} added, {len(d['removed'])} removed, {len(d['changed'])} changed, "
              f"{len(d['unchanged'])} unchanged", highlight=False)


def validate_command(
    tasks: Path = typer.Argument(..., help="A task folder or a folder of task folders."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL (default: the embedded SQLite store)."),
    json_out: bool = typer.Option(False, "--json", help="Print the validations as JSON on stdout."),
) -> None:
    """Validate tasks in local sandboxes: the oracle solves each, doing nothing does not, and the verifier gives the
    same reward twice. Every validation rollout and the version (with its validation) are recorded. Exit 1 if any
    task fails."""
    from forge_store import StoreError, get_settings, open_store

    from .._backends import get_backend

    loaded = _load(tasks)
    root = get_settings().resolved_sandbox_dir()
    root.mkdir(parents=True, exist_ok=True)
    backend = get_backend("local", root=root)
    results = []
    try:
        with open_store(store) as st:
            for t in loaded:
                v = validate_task(t, store=st, backend=backend)
                st.register_task_version(**task_version(t).store_row(lineage={"validation": v.as_dict()},
                                                                     metadata={"domain": t.domain}))
                st.add_event("task.validated", source="tasks", detail=v.as_dict())
                results.append(v)
    except StoreError as exc:
        _fail(exc)
    if json_out:
        print(json.dumps([v.as_dict() for v in results]))
    else:
        out = Console(soft_wrap=True)
        for v in results:
            mark = "[green]ok[/]" if v.passed else "[red]FAILED[/]"
            out.print(f"{mark} {v.task_id} {v.version[:12]}" + "".join(f"\n  {r}" for r in v.reasons),
                      highlight=False)
    if not all(v.passed for v in results):
        raise typer.Exit(1)
