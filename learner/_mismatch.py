"""Logprob mismatch between the engine that sampled a completion and a re-score of it under a policy version.

For every completion token: ``d = logp_V - logp_engine`` and the importance ratio ``r = exp(d)`` (how much more
likely version V finds the token than the behaviour policy that sampled it). Per call, per rollout and per slice:

* ``mismatch_mean`` / ``mismatch_max``: mean and max of ``|d|``; ``mismatch_p99`` its 99th percentile;
* ``kl_k3``: the k3 estimate of KL(behaviour || V), the mean of ``r - 1 - log r`` over the tokens (unbiased, since
  the tokens were sampled by the behaviour policy; each term is >= 0);
* ``ratio_mean``: the mean of ``r`` (1 in expectation when V is the behaviour policy);
* ``out_of_band``: the share of tokens whose ratio leaves [1 - eps, 1 + eps] (PPO's clip range by default).

Scoring calls under the version and engine that produced them must give ratios of 1: ``self_consistency`` checks it
and, where it fails, names the tokens that differ most.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from forge_store import RescoreRow, Store, rescores

DEFAULT_EPS = 0.2
SELF_BAND = (0.99, 1.01)


@dataclass
class Tally:
    """Running sums over tokens (pooled: a long call weighs by its tokens)."""

    eps: float = DEFAULT_EPS
    calls: int = 0
    tokens: int = 0
    sum_abs: float = 0.0
    max_abs: float = 0.0
    sum_k3: float = 0.0
    sum_ratio: float = 0.0
    out: int = 0
    diffs: list[float] = field(default_factory=list)

    def add(self, engine: Sequence[float], scored: Sequence[float]) -> None:
        if len(engine) != len(scored):
            raise ValueError(f"{len(engine)} engine logprobs against {len(scored)} re-scored ones: a re-score "
                             "holds one logprob per completion token of its call")
        self.calls += 1
        lo, hi = 1 - self.eps, 1 + self.eps
        for e, s in zip(engine, scored):
            d = s - e
            r = math.exp(d)
            self.tokens += 1
            self.sum_abs += abs(d)
            self.max_abs = max(self.max_abs, abs(d))
            self.sum_k3 += r - 1 - d
            self.sum_ratio += r
            self.out += not lo <= r <= hi
            self.diffs.append(abs(d))

    def row(self) -> dict:
        n = max(self.tokens, 1)
        return {"calls": self.calls, "tokens": self.tokens, "mismatch_mean": self.sum_abs / n,
                "mismatch_max": self.max_abs, "mismatch_p99": percentile(self.diffs, 0.99),
                "kl_k3": self.sum_k3 / n, "ratio_mean": self.sum_ratio / n, "out_of_band": self.out / n,
                "eps": self.eps}


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``; 0 for none."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


@dataclass(frozen=True)
class Pair:
    """One re-scored call beside what the engine recorded for it."""

    call_id: str
    rollout_id: str | None
    behaviour: str | None    # the policy version that served the call
    version: str             # the version it was re-scored under
    scorer: str
    engine: list[float]
    scored: list[float]
    completion_ids: list[int]


def pairs(store: Store, *, version: str | None = None, scorer: str | None = None,
          rows: Iterable[RescoreRow] | None = None) -> list[Pair]:
    """Stored re-scores (of ``version`` / ``scorer``, or ``rows``) joined with the calls' engine logprobs; calls the
    engine gave no logprobs for are left out (there is nothing to compare)."""
    rows = list(rows) if rows is not None else rescores(store, policy_version_id=version, scorer=scorer)
    by_rollout: dict[str | None, list[RescoreRow]] = defaultdict(list)
    for r in rows:
        by_rollout[r.rollout_id].append(r)
    calls = {}
    for rid, chunk in store.token_calls([r for r in by_rollout if r is not None]).items():
        calls.update({c.id: c for c in chunk})
    out = []
    for r in rows:
        c = calls.get(r.call_id)
        if c is None or c.logprobs is None:
            continue
        out.append(Pair(r.call_id, r.rollout_id, c.policy_version_id, r.policy_version_id, r.scorer,
                        c.completion_logprobs, r.logprobs, c.completion_token_ids or []))
    return out


def tally(items: Iterable[Pair], eps: float = DEFAULT_EPS) -> Tally:
    t = Tally(eps)
    for p in items:
        t.add(p.engine, p.scored)
    return t


def per_call(items: Iterable[Pair], eps: float = DEFAULT_EPS) -> list[dict]:
    return [{"call_id": p.call_id, "rollout_id": p.rollout_id, "behaviour": p.behaviour, "version": p.version,
             "scorer": p.scorer, **tally([p], eps).row()} for p in items]


def per_rollout(items: Iterable[Pair], eps: float = DEFAULT_EPS) -> list[dict]:
    groups: dict[tuple, list[Pair]] = defaultdict(list)
    for p in items:
        groups[(p.rollout_id, p.behaviour, p.version, p.scorer)].append(p)
    return [{"rollout_id": k[0], "behaviour": k[1], "version": k[2], "scorer": k[3], **tally(v, eps).row()}
            for k, v in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0]))]


def by_version(store: Store, items: Iterable[Pair], eps: float = DEFAULT_EPS) -> list[dict]:
    """One row per (behaviour version, re-scored version, scorer), with each version's training step."""
    steps = {p["id"]: p.get("global_step") for p in store.lineage("policy_versions")}
    groups: dict[tuple, list[Pair]] = defaultdict(list)
    for p in items:
        groups[(p.behaviour, p.version, p.scorer)].append(p)
    rows = []
    for (behaviour, version, scorer), v in groups.items():
        row = tally(v, eps).row()
        row.pop("eps")
        rows.append({"behaviour": behaviour, "behaviour_step": steps.get(behaviour), "rescored_under": version,
                     "rescored_step": steps.get(version), "scorer": scorer, **row})
    return sorted(rows, key=lambda r: (r["behaviour_step"] if r["behaviour_step"] is not None else -1,
                                       str(r["behaviour"]), r["rescored_step"] if r["rescored_step"] is not None
                                       else -1, str(r["rescored_under"]), r["scorer"]))


def self_consistency(items: Sequence[Pair], band: tuple[float, float] = SELF_BAND, worst: int = 5) -> dict:
    """Calls re-scored under the version that served them: the mean ratio must lie in ``band``. The report names
    the tokens that differ most when it does not (or always, up to ``worst``)."""
    own = [p for p in items if p.behaviour is not None and p.behaviour == p.version]
    t = tally(own)
    row = t.row()
    tokens = sorted(((abs(s - e), p.call_id, i, p.completion_ids[i] if i < len(p.completion_ids) else None, e, s)
                     for p in own for i, (e, s) in enumerate(zip(p.engine, p.scored))), reverse=True)[:worst]
    ok = bool(own) and band[0] <= row["ratio_mean"] <= band[1]
    return {"calls": t.calls, "tokens": t.tokens, "ratio_mean": row["ratio_mean"], "kl_k3": row["kl_k3"],
            "mismatch_max": row["mismatch_max"], "band": list(band), "ok": ok,
            "worst_tokens": [{"call_id": c, "position": i, "token_id": tid, "engine": e, "rescored": s,
                              "abs_diff": d} for d, c, i, tid, e, s in tokens]}


WHY_SELF_FAILS = (
    "a self re-score differs when the engine and the scorer do not compute the same distribution: the engine ran "
    "another dtype (bfloat16 against the scorer's float32: differences of ~1e-2 per token), the engine returned "
    "processed logprobs (after temperature or top-p) instead of the raw model's, the call was served by weights "
    "other than the version recorded (a switch not fenced), or the token ids are not the ones sampled (a call "
    "not token-exact)")
