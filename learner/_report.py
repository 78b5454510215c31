"""Print the tables of a behaviour report (``openforge analyze``, the demo's report) with rich.

Tables fold long cells instead of cutting them, so they stay readable when the output is not a terminal.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def fmt(v) -> str:
    """A cell's text, with rich markup escaped (a metric named ``success[check]`` prints as it is)."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return escape(str(v))


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




def comparison_rows(diffs, label_a: str = "A", label_b: str = "B") -> list[dict]:
    """``learner.compare_versions``' differences as table rows: the two values, B - A and its 95% interval."""
    rows = []
    for d in diffs:
        ci = "-" if d.ci95 is None else f"[{d.ci95[0]:+.3f}, {d.ci95[1]:+.3f}]"
        rows.append({"rubric": d.metric, label_a: d.a, label_b: d.b,
                     f"{label_b} - {label_a}": "-" if d.diff is None else f"{d.diff:+.3f}", "95% CI": ci,
                     "excludes 0": "-" if d.ci95 is None else ("yes" if d.ci95[0] > 0 or d.ci95[1] < 0 else "no"),
                     "tasks": d.n_tasks if d.paired else f"{d.n_tasks} (unpaired)",
                     "McNemar p": "-" if d.p_value is None else f"{d.p_value:.3g}"})
    return rows


def print_comparison(out: Console, title: str, diffs, label_a: str, label_b: str) -> None:
    """The table of ``openforge analyze --compare`` and of the demo's final report."""
    print_table(out, title, comparison_rows(diffs, label_a, label_b))
