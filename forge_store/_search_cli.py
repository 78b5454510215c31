"""``openforge search QUERY``: the calls whose text holds QUERY (``Store.search``), as a table or ``--json``.

Declared as an entry point in ``pyproject.toml``. Errors are one red line (value, rule, fix) and exit code 2.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Optional

import typer
from rich.console import Console

from ._errors import StoreError
from ._settings import get_settings
from ._tables import print_table

err = Console(stderr=True)


def _fail(msg: object) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(2)


def _date(option: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        d = datetime.fromisoformat(value)
    except ValueError:
        _fail(f"{option} {value!r} is not a date or time: write it as YYYY-MM-DD or YYYY-MM-DDTHH:MM")
    return d if d.tzinfo else d.replace(tzinfo=timezone.utc)


def search_command(
    query: str = typer.Argument(..., help="Text to find, as written (any case; 3 characters or more), in every "
                                "call's new prompt messages, answer, tool calls, tool results and error."),
    task: Optional[str] = typer.Option(None, "--task", help="Only rollouts of this task id."),
    version: Optional[str] = typer.Option(None, "--version", help="Only rollouts of this policy version."),
    harness: Optional[str] = typer.Option(None, "--harness", help="Only rollouts of this harness id."),
    outcome: Optional[str] = typer.Option(None, "--outcome", help="Only rollouts with this outcome (success, "
                                          "failure, policy_timeout, harness_error, infra_error)."),
    purpose: Optional[str] = typer.Option(None, "--purpose", help="Only rollouts of this purpose (train, eval, "
                                          "teacher)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only rollouts started at or after (YYYY-MM-DD)."),
    until: Optional[str] = typer.Option(None, "--until", help="Only rollouts started before (YYYY-MM-DD)."),
    limit: int = typer.Option(50, "--limit", help="Print at most this many calls (newest first)."),
    as_json: bool = typer.Option(False, "--json", help="Print {query, hits, more} as JSON."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL (default: OPENFORGE_STORE_URL or the "
                                        "SQLite file under OPENFORGE_HOME).", show_default=False),
) -> None:
    """Full-text search over every call: which calls (and rollouts) hold QUERY, newest first, with a snippet."""
    from ._store import open_store

    start, end = _date("--since", since), _date("--until", until)
    settings = get_settings(auto_upgrade=False)
    try:
        with open_store(store or settings.resolved_store_url(), settings=settings) as st:
            hits, more = st.search(query, task_id=task, policy_version_id=version, harness_id=harness,
                                   outcome=outcome, purpose=purpose, since=start, until=end, limit=limit)
    except StoreError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps({"query": query, "hits": [h.as_dict() for h in hits], "more": more}))
        return
    out = Console()
    if not hits:
        out.print(f"no call holds {query!r}" + (" with these filters" if any((task, version, harness, outcome,
                                                                              purpose, since, until)) else ""),
                  highlight=False, markup=False)
        return
    print_table(out, f"calls holding {query!r}, newest first",
                [{"rollout": h.rollout_id, "step": h.seq, "call": h.call_id, "task": h.task_id,
                  "version": h.policy_version_id, "outcome": h.outcome, "snippet": h.snippet} for h in hits],
                right=("step",))
    if more:
        err.print(f"(more hits than {limit}; pass --limit or narrow the search with --task, --version, --outcome, "
                  "--purpose, --since)", highlight=False, markup=False)
