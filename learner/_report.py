"""Print the tables of a behaviour report (``openforge analyze``, the demo's report).

The layout is the store's shared one (``forge_store.print_table``): no column narrower than its header, one record
per block when the headers do not fit, so the tables stay readable when the output is not a terminal.
"""

from __future__ import annotations

from rich.console import Console

from forge_store import print_table

__all__ = ["comparison_rows", "print_comparison", "print_table"]


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
