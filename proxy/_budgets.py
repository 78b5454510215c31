"""Per-rollout budgets: the most model calls, prompt + completion tokens and seconds since registration a rollout may
spend. Given at registration (``POST /admin/rollouts``: ``max_calls``, ``max_tokens``, ``max_wall_s``) over the
settings' defaults (``OPENFORGE_PROXY_ROLLOUT_MAX_*``).

A call over budget never goes upstream: the service records it (error class ``budget_exceeded``, so the rollout's
record shows where it stopped) and answers it in its API's error shape with HTTP 400. Not 429: the OpenAI and
Anthropic SDKs, and the harnesses built on them, retry a 429 with back-off (Claude Code up to ten times), and a spent
budget does not come back, so each retry would wait, be refused and be recorded again; a 400 is final, and the SDKs
raise it as a ``BadRequestError`` whose message the harness shows.

Tokens are counted from the recorded usage of the rollout's earlier calls: a call is admitted while the total is
under ``max_tokens``, so the call that crosses it completes (its size is known only from its answer) and the next
one is refused. Calls count when they are admitted, refused ones not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ._errors import ProxyError

BUDGET_EXCEEDED = "budget_exceeded"  # the refused call's error class and the error answer's code


@dataclass(frozen=True, slots=True)
class Limits:
    """A rollout's limits; None: no limit."""

    max_calls: int | None = None
    max_tokens: int | None = None
    max_wall_s: float | None = None

    def over(self, defaults: Limits) -> Limits:
        """These limits, ``defaults``' where these give none."""
        return Limits(*(mine if mine is not None else default for mine, default in (
            (self.max_calls, defaults.max_calls), (self.max_tokens, defaults.max_tokens),
            (self.max_wall_s, defaults.max_wall_s))))

    def __bool__(self) -> bool:
        return not (self.max_calls is None and self.max_tokens is None and self.max_wall_s is None)


@dataclass(slots=True)
class Budget:
    """What one rollout has spent of its ``limits``, from its registration on."""

    limits: Limits
    started: float = field(default_factory=time.monotonic)
    calls: int = 0
    tokens: int = 0

    def admit(self, rollout_id: str | None) -> ProxyError | None:
        """Count one call; or, the budget spent, the error to answer it with (the call is not counted)."""
        lim = self.limits
        if lim.max_calls is not None and self.calls >= lim.max_calls:
            spent = f"it has made {self.calls} calls, its max_calls of {lim.max_calls}"
        elif lim.max_tokens is not None and self.tokens >= lim.max_tokens:
            spent = (f"its calls have used {self.tokens:,} tokens (prompt + completion), its max_tokens of "
                     f"{lim.max_tokens:,}")
        elif lim.max_wall_s is not None and (age := time.monotonic() - self.started) > lim.max_wall_s:
            spent = f"it was registered {age:.0f}s ago, past its max_wall_s of {lim.max_wall_s:g}s"
        else:
            self.calls += 1
            return None
        return ProxyError(400, f"rollout {rollout_id!r} has spent its budget: {spent}; the proxy refuses its further "
                               "calls without sending them to the model. End the rollout here; to allow more, register "
                               "the next rollout with a larger budget (max_calls, max_tokens, max_wall_s)",
                          code=BUDGET_EXCEEDED)

    def charge(self, usage: dict | None) -> None:
        """Add a recorded call's prompt + completion tokens (its usage, as the store keeps it)."""
        if usage:
            for key in ("prompt_tokens", "completion_tokens"):
                n = usage.get(key)
                if type(n) is int and n > 0:
                    self.tokens += n
