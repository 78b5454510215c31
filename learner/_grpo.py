"""GRPO groups and outcome advantages over reconstructed rollouts.

Follows veRL's ``compute_grpo_outcome_advantage`` (mean-centred, divided by the group's unbiased std + epsilon;
``norm_by_std=False`` is the Dr.GRPO variant), so the numbers can be cross-checked against veRL later.
Where we depart from the paper / veRL, on purpose:

1. **Normalise over rollouts, not segments.** A rollout that reconstructs into k segments counts once in its
   group's mean and std; its advantage is then copied to each segment (DESIGN). veRL, fed the segments directly,
   would weight rollouts by their segment count.
2. **Group of one → advantage 0** by default (no baseline, no signal). veRL instead uses mean 0 / std 1, i.e. the
   raw reward / (1 + eps); ``singleton="verl"`` reproduces that for the cross-check.
3. **Discount across segments.** Segment t of T gets reward ``gamma**(T-t) * r_T`` and advantage
   ``gamma**(T-t) * A``; gamma = 1 (the default) is plain GRPO.
4. **float64** arithmetic (veRL: float32 tensors); expect agreement to ~1e-6, not bit-exactness.
5. **Terminal reward = the reward that counts** by the store's one rule (``Store.latest_rewards``: the latest row
   by ingest order, as of the export watermark, from the chosen sources). Rewards are append-only, so a re-grade is
   a new row that supersedes the old one for training; the superseded rows stay in the store and the chosen reward
   id goes into the sample's lineage.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

SINGLETON_MODES = ("zero", "verl")


@dataclass(frozen=True)
class GrpoConfig:
    gamma: float = 1.0
    epsilon: float = 1e-6
    norm_by_std: bool = True
    singleton: str = "zero"

    def __post_init__(self) -> None:
        if self.singleton not in SINGLETON_MODES:
            raise ValueError(f"singleton={self.singleton!r}: use one of {', '.join(SINGLETON_MODES)}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma={self.gamma}: a discount lies in (0, 1]; pass 1.0 for plain GRPO")


@dataclass(frozen=True)
class GroupResult:
    advantages: list[float]
    mean: float
    std: float
    note: str | None  # "singleton" or "all_equal" (every advantage 0: the group teaches nothing)


def group_advantages(rewards: Sequence[float], cfg: GrpoConfig = GrpoConfig()) -> GroupResult:
    """Advantages of one group's rollouts, in the order given."""
    n = len(rewards)
    if n == 0:
        raise ValueError("a GRPO group needs at least one rollout with a reward")
    if n == 1:
        if cfg.singleton == "zero":
            return GroupResult([0.0], rewards[0], 0.0, "singleton")
        adv = rewards[0] / (1.0 + cfg.epsilon) if cfg.norm_by_std else rewards[0]
        return GroupResult([adv], 0.0, 1.0, "singleton")
    mean = math.fsum(rewards) / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (n - 1))
    if cfg.norm_by_std:
        adv = [(r - mean) / (std + cfg.epsilon) for r in rewards]
    else:
        adv = [r - mean for r in rewards]
    note = "all_equal" if all(r == rewards[0] for r in rewards) else None
    if note:
        adv = [0.0] * n  # exactly zero, not (r - mean) rounding noise
    return GroupResult(adv, mean, std, note)


def grpo_advantages(groups: Mapping[str, Sequence[float]], cfg: GrpoConfig = GrpoConfig()) -> dict[str, GroupResult]:
    """DESIGN's seam: group id -> terminal rewards of its rollouts  =>  group id -> advantages (same order)."""
    return {gid: group_advantages(rs, cfg) for gid, rs in groups.items()}


def segment_values(value: float, n_segments: int, gamma: float) -> list[float]:
    """``gamma**(T-t) * value`` for segments t = 0..T (T = n_segments - 1)."""
    return [value * gamma ** (n_segments - 1 - t) for t in range(n_segments)]


def policy_order(policy_rows: Sequence[dict]) -> dict[str, int]:
    """Rank of each policy version: by ``global_step`` when every version has one, else by creation (ingest) order."""
    rows = list(policy_rows)
    if rows and all(r.get("global_step") is not None for r in rows):
        rows.sort(key=lambda r: (r["global_step"], r["ingest_seq"]))
    else:
        rows.sort(key=lambda r: r["ingest_seq"])
    return {r["id"]: i for i, r in enumerate(rows)}


def policy_lag(order: Mapping[str, int], current: str, versions: Iterable[str | None]) -> int | None:
    """How many versions the oldest of ``versions`` trails ``current``; None when one of them is unknown."""
    ranks = []
    for v in versions:
        if v is None:
            continue
        if v not in order:
            return None
        ranks.append(order[v])
    if not ranks:
        return None
    return order[current] - min(ranks)
