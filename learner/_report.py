"""Print the tables of a behaviour report (``openforge analyze``, the demo's report) with rich.

Tables fold long cells instead of cutting them, so they stay readable when the output is not a terminal.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def fmt(v) -> str:
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
            table.add_column(fmt(row[cols[0]]), justify="right", overflow="fold")
        for metric in cols[1:]:
            table.add_row(metric, *(fmt(row.get(metric)) for row in rows))
    else:
        for col in cols:
            table.add_column(col, justify="left" if isinstance(rows[0][col], str) else "right", overflow="fold")
        for row in rows:
            table.add_row(*(fmt(row.get(c)) for c in cols))
    out.print(table)


