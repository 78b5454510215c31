"""``Backoff``: the delays between tries of something that fails for a while, for every retry loop of OpenForge.

Exponential (``first``, doubling, never more than ``cap``), optionally with equal jitter (each delay drawn from the upper half
of its step, so that many clients that failed together do not come back together) and a floor a server may set
(``Retry-After``); ``reset`` after progress starts over from ``first``.

Why not ``tenacity``: the four loops that use this (``db_apply`` while the database is away, ``db_ready`` before a
writer's first batch, the drain process's supervisor, the Kubernetes API client) share only this sequence of
delays. Each stops in its own way (a closing writer's ``wait`` that says stop, a count of attempts, a supervisor that
closes) and one restarts its delays after progress; ``tenacity.Retrying`` owns the loop, which would take a
raise-to-stop sleep in two of them and cannot start over in the third.
"""

from __future__ import annotations

import random


class Backoff:
    """``next()``: the delay before the next try; ``reset()`` after progress. Not thread-safe: one per loop."""

    __slots__ = ("first", "cap", "jitter", "_step", "_random")

    def __init__(self, first: float, cap: float, *, jitter: bool = False, rng: random.Random | None = None):
        if first <= 0 or cap <= 0:
            raise ValueError(f"Backoff(first={first}, cap={cap}): both are delays in seconds and must be > 0")
        self.first, self.cap, self.jitter = first, cap, jitter
        self._random = rng or random
        self._step = min(first, cap)

    def next(self, floor: float | None = None) -> float:
        """The next delay (at least ``floor``: a server's ``Retry-After``); the one after it doubles, up to ``cap``."""
        step = self._step
        self._step = min(step * 2, self.cap)
        delay = self._random.uniform(step / 2, step) if self.jitter else step
        return max(delay, floor) if floor is not None else delay

    def reset(self) -> None:
        self._step = min(self.first, self.cap)
