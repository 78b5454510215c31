"""The learning loop's scoreboard: success rate per policy version with a 95% interval, and what stands behind it.

Success rates are over rollouts (one per task on the held-out split, a group per task on the train split), so the
interval is Wilson's score interval for a binomial proportion: it stays inside [0, 1] and is honest at the small
counts a laptop run has (at 0 of 20 it is [0, 0.16], not [0, 0]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The score interval of ``successes / n`` (``learner.wilson_interval``); ``(0.0, 1.0)`` when ``n`` is 0."""
    from learner import wilson_interval

    return wilson_interval(successes, n, z) or (0.0, 1.0)


@dataclass
class Rate:
    successes: int = 0
    n: int = 0

    @property
    def value(self) -> float | None:
        return self.successes / self.n if self.n else None

    def interval(self) -> tuple[float, float]:
        return wilson(self.successes, self.n)

    def text(self) -> str:
        if not self.n:
            return "-"
        lo, hi = self.interval()
        return f"{self.value:.2f} [{lo:.2f}, {hi:.2f}] ({self.successes}/{self.n})"

    def as_dict(self) -> dict:
        lo, hi = self.interval()
        return {"rate": self.value, "successes": self.successes, "n": self.n, "ci95": [round(lo, 4), round(hi, 4)]}


@dataclass
class VersionRow:
    """One policy version of the chain: how it did and what it was made from."""

    version: str
    parent: str | None
    made_by: str  # "base", "sft", "grpo round 1", ...
    heldout: Rate = field(default_factory=Rate)
    train: Rate = field(default_factory=Rate)
    validation: Rate = field(default_factory=Rate)  # staged SFT: greedy success on validation tasks
    sampled: Rate = field(default_factory=Rate)  # held-out rollouts sampled at the GRPO temperature (--eval-samples)
    calls: int = 0  # model calls recorded under this version (its rollouts, all purposes)
    samples: int | None = None  # training samples in the shard this version was trained on
    seconds: dict = field(default_factory=dict)  # phase -> seconds spent making / measuring this version

    def as_dict(self) -> dict:
        return {"version": self.version, "parent": self.parent, "made_by": self.made_by,
                "heldout": self.heldout.as_dict(), "train": self.train.as_dict(),
                "validation": self.validation.as_dict(), "sampled": self.sampled.as_dict(), "calls": self.calls,
                "samples": self.samples, "seconds": self.seconds}


def difference(a: Rate, b: Rate, z: float = Z95) -> tuple[float | None, tuple[float, float] | None]:
    """``a - b`` and its 95% interval (Newcombe's method from the two Wilson intervals); None without data."""
    if not a.n or not b.n:
        return None, None
    (la, ua), (lb, ub) = wilson(a.successes, a.n, z), wilson(b.successes, b.n, z)
    pa, pb = a.value, b.value
    d = pa - pb
    lower = d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2)
    upper = d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)
    return d, (max(-1.0, lower), min(1.0, upper))


def print_scoreboard(console, rows: list[VersionRow], phases: dict[str, float]) -> None:
    """The table the loop ends with (rich folds long cells, so it stays readable in a log file)."""
    from forge_store import print_table

    staged = any(r.validation.n for r in rows)   # staged SFT: the stages' validation success
    sampled = any(r.sampled.n for r in rows)     # --eval-samples: held-out success sampled at the GRPO temperature
    print_table(console, "Policy versions along the chain (success = full reward; 95% Wilson intervals)",
                [{"version": r.version, "made by": r.made_by, "parent": r.parent or "-",
                  "held-out success": r.heldout.text(),
                  **({"held-out sampled": r.sampled.text()} if sampled else {}), "train success": r.train.text(),
                  **({"validation": r.validation.text()} if staged else {}), "calls": f"{r.calls:,}",
                  "samples": "-" if r.samples is None else f"{r.samples:,}"} for r in rows],
                right=("held-out success", "held-out sampled", "train success", "validation", "calls", "samples"))
    times = [{"phase": name, "seconds": f"{s:.1f}"} for name, s in phases.items()]
    print_table(console, "Time per phase", [*times, {"phase": "total", "seconds": f"{sum(phases.values()):.1f}"}],
                right=("seconds",))
