"""Live progress of a run of rollouts, shared by ``openforge run`` and ``openforge demo``."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class RunProgress:
    """A rich progress bar: rollouts done / total, groups, outcomes and mean reward as they happen."""

    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("[bold]rollouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("{task.description}"), console=console, transient=False)
        self.task = self.bar.add_task("", total=None)
        self._hold = ""

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        self.bar.__exit__(*exc)

    def hold(self, reason: str) -> None:
        self._hold = reason

    def update(self, summary, *, total: int | None, running: int) -> None:
        oc = summary.outcomes
        mean = summary.mean_reward
        text = (f"groups {summary.groups_complete}/{summary.groups}  running {running}  "
                + " ".join(f"{k} {v}" for k, v in sorted(oc.items()))
                + (f"  mean reward {mean:.2f}" if mean is not None else "")
                + (f"  [yellow]waiting: {self._hold}[/]" if self._hold and running == 0 else ""))
        self._hold = ""
        kw = {"completed": len(summary.results) - summary.retried}
        if total is not None:
            kw["total"] = total
        self.bar.update(self.task, description=text, **kw)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops a run the way Ctrl-C does: rollouts end as ``cancelled``, sandboxes are destroyed."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
