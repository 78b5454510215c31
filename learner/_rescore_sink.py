"""Where every scorer's results go: the store's ``rescores`` table, a batch per transaction, from the one thread
that consumes the scorer, with progress. Shared by the Hugging Face scorer (``_rescore``) and the served one
(``_rescore_served``), so that both keep the same rows, the same resumability and the same progress lines."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from forge_store import RescoreRow, Store, TokenCall, record_rescores


class RescoreError(ValueError):
    """A re-score that cannot run as asked; the message says which value and what to do."""


@dataclass
class RescoreResult:
    version: str
    scorer: str
    selected_calls: int = 0
    already: int = 0
    scored_calls: int = 0
    written: int = 0
    tokens: int = 0
    seconds: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)
    lineage: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict:
        return {"version": self.version, "scorer": self.scorer, "selected_calls": self.selected_calls,
                "already_scored": self.already, "scored_calls": self.scored_calls, "written": self.written,
                "tokens": self.tokens, "seconds": round(self.seconds, 2), "tokens_per_s": round(self.tokens_per_s, 1),
                "skipped": self.skipped, "lineage": self.lineage}


class Sink:
    """``add(call, logprobs)`` as results come; a batch of ``flush`` rows is written in one transaction (what a kill
    can lose). ``before_write``, when given, runs before every write and may refuse it by raising (the served
    scorer checks there that the proxy still serves the version)."""

    def __init__(self, store: Store, res: RescoreResult, todo: Sequence[TokenCall], flush: int,
                 say: Callable[[str], None], before_write: Callable[[], object] | None = None):
        self.store, self.res, self.flush_every, self.say, self.before_write = store, res, flush, say, before_write
        self.calls, self.total_tokens = len(todo), sum(len(c.completion) // 4 for c in todo)
        self.batch: list[RescoreRow] = []
        self.t0, self.last = time.monotonic(), 0.0

    def add(self, call: TokenCall, logprobs: list[float]) -> None:
        res = self.res
        if len(logprobs) != len(call.completion) // 4:
            raise RescoreError(f"the scorer gave {len(logprobs)} logprobs for call {call.id}'s "
                               f"{len(call.completion) // 4} completion tokens")
        self.batch.append(RescoreRow(call.id, call.rollout_id, res.version, res.scorer, dict(res.lineage), logprobs))
        res.scored_calls += 1
        res.tokens += len(logprobs)
        if len(self.batch) >= self.flush_every:
            self.write()
            self.say(f"stored {res.written} re-scores")
        now = time.monotonic() - self.t0
        if now - self.last >= 5 or res.scored_calls == self.calls:
            self.last = now
            rate = res.tokens / now if now else 0.0
            left = (self.total_tokens - res.tokens) / rate if rate else 0.0
            self.say(f"{res.scored_calls}/{self.calls} calls, {res.tokens:,}/{self.total_tokens:,} tokens, "
                     f"{rate:,.0f} tokens/s, ~{left:.0f} s left")

    def write(self) -> None:
        if not self.batch:
            return
        if self.before_write is not None:
            try:
                self.before_write()
            except RescoreError:
                self.batch = []   # refused: these scores may not be the version's; never written
                raise
        self.res.written += record_rescores(self.store, self.batch)
        self.batch = []
