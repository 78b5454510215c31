"""Tables on a console that stay readable in a pipe: every command that prints rows prints them through here.

Off a terminal (a file, ``less``, a notebook cell) rich lays tables out at 80 columns and squeezes every column to fit,
down to 4-5 characters (issue 33). Here no column is ever narrower than its header: a table whose headers fit the
console's width is printed as a table (long cells fold inside their column), and one whose headers do not fit is
printed one record per block (``header  value`` lines), which reads at any width. The store owns this because
it is the one package every part (learner, rollout, the roof) may import.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

# rich's default box with padding (0, 1): one border character plus two spaces of padding per column, plus the last
# border of the row.
_PER_COLUMN = 3


def cell(v) -> str:
    """A cell's text: ``-`` for nothing, three decimals for floats, the rest as ``str``."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def fits(headers: list[str], width: int) -> bool:
    """Whether a table of these headers, each column at least as wide as its header, fits ``width`` characters."""
    return sum(len(h) + _PER_COLUMN for h in headers) + 1 <= width


def print_table(out: Console, title: str | None, rows: list[dict], *, transpose: bool = False,
                right: tuple[str, ...] | None = None) -> None:
    """``rows`` (dicts with the same keys, in column order) as a table, or one record per block when the headers do
    not fit ``out.width``. ``transpose`` with up to three rows puts one key per row (a metric per line). ``right``
    names the right-justified columns (default: the columns whose first value is not a string)."""
    if not rows:
        out.print(Text(f"{title}: nothing yet" if title else "(no rows)", style="dim"))
        return
    headers = list(rows[0])
    if transpose and len(rows) <= 3:
        first = headers[0]
        rows = [{first: key, **{cell(r[first]): r.get(key) for r in rows}} for key in headers[1:]]
        headers = list(rows[0])
        right = tuple(headers[1:])
    if right is None:
        right = tuple(h for h in headers if not isinstance(rows[0].get(h), str))
    if not fits(headers, out.width):
        print_records(out, title, rows)
        return
    table = Table(title=escape(title) if title else None, title_justify="left")
    for h in headers:
        table.add_column(escape(h), justify="right" if h in right else "left", overflow="fold", min_width=len(h))
    for r in rows:
        table.add_row(*(escape(cell(r.get(h))) for h in headers))
    out.print(table)


def print_records(out: Console, title: str | None, rows: list[dict]) -> None:
    """One block per row: each key, padded to the longest, then its value; a blank line between blocks."""
    if title:
        out.print(Text(title, style="bold"))
    pad = max(len(k) for r in rows for k in r)
    for n, r in enumerate(rows):
        if n:
            out.print()
        for k, v in r.items():
            out.print(Text(f"{k.ljust(pad)}  {cell(v)}"), soft_wrap=False)
    out.print()
