"""What decides an export's content (``ExportConfig``, stored in its manifest so ``verify`` can re-derive it), the
exclusion record, and the rollout and call facts the selection rules read (run purpose, redactions)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from forge_store import RewardInfo, RolloutInfo, StoredCall

from ._grpo import GrpoConfig


class ExportError(ValueError):
    pass


@dataclass(frozen=True)
class ExportConfig:
    """Everything that decides an export's content; stored in the manifest so ``verify`` can re-derive it."""

    format: str = "verl"
    where: str | None = None
    keep_truncated: bool = False
    train_policy_timeouts: bool = True
    max_policy_lag: int | None = None
    current_policy: str | None = None
    min_group_size: int | None = None
    reward_sources: tuple[str, ...] | None = None
    gamma: float = 1.0
    epsilon: float = 1e-6
    norm_by_std: bool = True
    singleton: str = "zero"
    rows_per_shard: int = 100_000
    row_group_rows: int = 1024
    group_where: str | None = None  # keep a group whole when any of its rollouts matches (``--where`` language)
    allow_partial_groups: bool = False  # a ``--where`` may keep part of a GRPO group (advantages: whole group)
    include_redacted: bool = False  # export rollouts with a redacted call (their token ids carry the secret)
    include_self_calls: bool = False  # train on the calls a harness makes for itself (titles, routing, summaries)
    # off-policy weights (veRL shards): learner._rollout_weights' mode, its cap, the version whose re-score gives the
    # trainer's logprobs (None: the current policy version as of the watermark) and the scorer of that re-score
    rollout_is: str | None = None
    rollout_is_cap: float = 2.0
    rollout_is_version: str | None = None
    rollout_is_scorer: str = "hf-float32"
    # efficiency shaping of the advantages' rewards: a rollout of n model calls counts reward * (1 - call_cost)**(n-1)
    # (0: the reward as stored). Multiplicative, so a zero reward stays zero: quitting early is never paid for
    call_cost: float = 0.0
    # success-only rewards: a rollout counts 1.0 when its reward reaches this, else 0.0 (before call_cost), so that a
    # verifier's partial credit (steps done of a task) does not become a full-size advantage in a group without a
    # success; None: the reward as stored
    success_at: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.call_cost < 1.0:
            raise ExportError(f"call_cost={self.call_cost}: a share of the reward each model call after the first "
                              "costs, in [0, 1) (0: the stored reward; e.g. 0.1)")
        if self.success_at is not None and not self.success_at > 0:
            raise ExportError(f"success_at={self.success_at}: the reward from which a rollout counts as a success "
                              "is above 0 (e.g. 1.0, a verifier's full marks), or None for the reward as stored")

    def shaped(self, reward: float, calls: int) -> float:
        """The reward a rollout of ``calls`` model calls counts with in its group's advantages."""
        if self.success_at is not None:
            reward = 1.0 if reward >= self.success_at else 0.0
        return reward * (1.0 - self.call_cost) ** max(calls - 1, 0) if self.call_cost else reward

    def grpo(self) -> GrpoConfig:
        return GrpoConfig(gamma=self.gamma, epsilon=self.epsilon, norm_by_std=self.norm_by_std,
                          singleton=self.singleton)

    def to_json(self) -> dict:
        d = asdict(self)
        d["reward_sources"] = list(self.reward_sources) if self.reward_sources else None
        if self.rollout_is is None:   # exports without weights keep the config (and so the export id) they had
            for k in ("rollout_is", "rollout_is_cap", "rollout_is_version", "rollout_is_scorer"):
                del d[k]
        if not self.call_cost:   # nor do exports without shaping
            del d["call_cost"]
        if self.success_at is None:
            del d["success_at"]
        if not self.include_self_calls:   # nor those that leave self-calls out (older stores have none marked)
            del d["include_self_calls"]
        return d

    @classmethod
    def from_json(cls, d: dict) -> ExportConfig:
        d = dict(d)
        d["reward_sources"] = tuple(d["reward_sources"]) if d.get("reward_sources") else None
        return cls(**d)


@dataclass(frozen=True)
class Exclusion:
    reason: str
    rollout_id: str | None
    call_id: str | None
    detail: dict


def redactions(calls: list[StoredCall]) -> dict[str, list[str]]:
    """Call id -> the redaction rules that fired on it (its metadata's ``redacted``), for the calls that have any."""
    out = {}
    for c in calls:
        rules = (c.metadata or {}).get("redacted")
        if rules:
            out[c.id] = sorted(map(str, rules)) if isinstance(rules, (list, tuple)) else [str(rules)]
    return out


def split_self_calls(calls: list, keep: bool) -> tuple[list, dict[str, str]]:
    """(the calls that may become training data, call id -> kind of each harness self-call left out): a call the
    proxy marked as one the harness made for itself (its metadata's ``harness_self_call``, ``proxy._self_calls``:
    a title, a routing or loop check, a history summary) is not the harness's work on the task, so the task's reward
    says nothing of it; ``keep`` (``--include-self-calls``) keeps them."""
    if keep:
        return calls, {}
    marked = {c.id: str(kind) for c in calls if (kind := (c.metadata or {}).get("harness_self_call"))}
    return ([c for c in calls if c.id not in marked] if marked else calls), marked


PURPOSES = ("train", "eval", "teacher")


def rollout_purpose(info: RolloutInfo) -> str:
    """The purpose of the run a rollout belongs to, as recorded in its metadata; ``train`` for older stores."""
    purpose = (info.metadata or {}).get("purpose")
    return "train" if purpose is None else str(purpose)


def where_row(info: RolloutInfo, reward: RewardInfo | None) -> dict:
    d = asdict(info)
    d["reward"] = reward.value if reward else None
    d["purpose"] = rollout_purpose(info)
    return d
