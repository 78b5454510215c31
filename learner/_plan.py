"""Selection: which rollouts become training data, grouped for GRPO, and a stored reason for every one that does not.

Rules, in the order they are applied to each finished rollout (first match wins; unfinished rollouts as of the
watermark are counted, not excluded: a later export takes them):

0. The run's purpose (``rollout_purpose``: the rollout's ``metadata["purpose"]``, ``train`` when absent):
   ``evaluation`` for every ``eval`` rollout, whatever the format (held-out measurements never become training
   data); ``teacher`` for ``teacher`` rollouts in a token-level format (veRL, TRL: a teacher's calls are not the
   policy's samples, so they have no place in a policy-gradient shard; SFT shards take them); ``filtered`` for a
   purpose this version does not know (never trained on by guess).
1. ``filtered``: the ``--where`` filter is false (also ``policy_timeout`` rollouts when configured off).
2. ``infra_error``: outcome ``infra_error`` (invariant 6: never a zero reward).
3. ``no_reward``: outcome ``cancelled`` (never graded), or no reward row from the allowed sources.
4. ``missing_data``: the rollout names a group that is not in the store.
5. ``stale_policy``: the oldest policy version of the rollout (its own or any call's) trails the current one by
   more than ``max_policy_lag`` versions (off by default).
6. ``incomplete_group``: fewer surviving rollouts than ``min_group_size`` (default: the group's target size).

Rules 3 and 6 do not apply to the SFT format (it needs no reward). Calls are then excluded one by one
(``infra_error``, ``not_token_exact``, ``truncated``; see :mod:`learner._reconstruct`; the SFT format's own rules are
in :mod:`learner._sft`); a rollout whose calls are all excluded still counts in its group's GRPO statistics, since
its reward is a fair sample of the policy.
A rollout without a group is a group of its own (target size 1).

A rollout's reward is the one that counts by the store's rule (``Store.latest_rewards``: its latest from
``reward_sources``). Rewards and calls are read for runs of groups at once (``Store.latest_rewards``,
``Store.calls_by_rollout``), one query each per run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

from forge_store import RewardInfo, RolloutInfo, Store, StoredCall

from ._grpo import GrpoConfig, group_advantages, policy_lag, policy_order, segment_values
from ._query import parse_where
from ._reconstruct import CallExclusion, Reconstruction, reconstruct_rollout
from ._sft import Conversation, sft_conversations


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

    def grpo(self) -> GrpoConfig:
        return GrpoConfig(gamma=self.gamma, epsilon=self.epsilon, norm_by_std=self.norm_by_std,
                          singleton=self.singleton)

    def to_json(self) -> dict:
        d = asdict(self)
        d["reward_sources"] = list(self.reward_sources) if self.reward_sources else None
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


@dataclass
class RolloutPlan:
    info: RolloutInfo
    calls: list[StoredCall]
    reward: RewardInfo | None
    recon: Reconstruction | None = None    # token-level formats
    convs: list[Conversation] | None = None   # the SFT format
    advantage: float = 0.0

    def segment_rewards(self, gamma: float) -> list[float]:
        return segment_values(self.reward.value if self.reward else 0.0, len(self.recon.segments), gamma)

    def segment_advantages(self, gamma: float) -> list[float]:
        return segment_values(self.advantage, len(self.recon.segments), gamma)


@dataclass
class GroupPlan:
    key: str
    group: dict | None
    rollouts: list[RolloutPlan]
    note: str | None = None


@dataclass
class Tally:
    rollouts_seen: int = 0
    unfinished: int = 0
    calls: int = 0
    merged: int = 0
    groups: int = 0
    singleton_groups: int = 0
    all_equal_groups: int = 0
    exclusions: dict[str, int] = field(default_factory=lambda: defaultdict(int))


PURPOSES = ("train", "eval", "teacher")


def rollout_purpose(info: RolloutInfo) -> str:
    """The purpose of the run a rollout belongs to, as recorded in its metadata; ``train`` for older stores."""
    purpose = (info.metadata or {}).get("purpose")
    return "train" if purpose is None else str(purpose)


def _row(info: RolloutInfo, reward: RewardInfo | None) -> dict:
    d = asdict(info)
    d["reward"] = reward.value if reward else None
    d["purpose"] = rollout_purpose(info)
    return d


class Planner:
    """Walks the store as of one watermark and yields groups ready to write, in (group, rollout) order."""

    def __init__(self, store: Store, cfg: ExportConfig, watermark: int,
                 on_exclusion: Callable[[Exclusion], None] | None = None, *, batch_rollouts: int = 64):
        self.store, self.cfg, self.wm, self.batch_rollouts = store, cfg, watermark, batch_rollouts
        self.on_exclusion = on_exclusion or (lambda e: None)
        self.tally = Tally()
        self.pred = parse_where(cfg.where) if cfg.where else None
        self.token_level = cfg.format != "sft"
        pvs = store.lineage("policy_versions", as_of=watermark)
        self.policies = {p["id"]: p for p in pvs}
        self.order = policy_order(pvs)
        self.current = cfg.current_policy or (max(self.order, key=self.order.get) if self.order else None)
        if cfg.current_policy and cfg.current_policy not in self.order:
            raise ValueError(f"--current-policy {cfg.current_policy!r} is not a policy version in the store as of "
                             f"watermark {watermark}; known: {', '.join(sorted(self.order)) or '(none)'}")
        self.groups = {g["id"]: g for g in store.lineage("rollout_groups", as_of=watermark)}
        self.tasks = {t["id"]: t for t in store.lineage("tasks", as_of=watermark)}
        self.harnesses = {h["id"]: h for h in store.lineage("harnesses", as_of=watermark)}
        self.buckets: dict[str, list[RolloutInfo]] = defaultdict(list)
        for r in store.iter_rollouts(as_of=watermark):
            self.tally.rollouts_seen += 1
            if r.status != "finished":
                self.tally.unfinished += 1
                continue
            self.buckets[r.group_id or f"~{r.id}"].append(r)
        self.total = sum(len(v) for v in self.buckets.values())

    def _exclude(self, reason: str, rollout_id: str | None, call_id: str | None = None, **detail) -> None:
        self.tally.exclusions[reason] += 1
        self.on_exclusion(Exclusion(reason, rollout_id, call_id, detail))

    def _rollout_rule(self, info: RolloutInfo, reward: RewardInfo | None) -> tuple[str, dict] | None:
        cfg = self.cfg
        purpose = rollout_purpose(info)
        if purpose == "eval":
            return "evaluation", {"purpose": purpose, "rule": "evaluation rollouts are never training data"}
        if purpose == "teacher" and self.token_level:
            return "teacher", {"purpose": purpose, "format": cfg.format,
                               "rule": "a teacher's demonstrations go to SFT shards, never to a policy-gradient shard"}
        if purpose not in PURPOSES:
            return "filtered", {"purpose": purpose, "rule": f"a run's purpose is one of {', '.join(PURPOSES)}"}
        if self.pred is not None and not self.pred(_row(info, reward)):
            return "filtered", {"where": cfg.where}
        if info.outcome == "policy_timeout" and not cfg.train_policy_timeouts:
            return "filtered", {"rule": "policy_timeout rollouts are configured off"}
        if info.outcome == "infra_error":
            return "infra_error", {"outcome_detail": info.outcome_detail}
        if info.outcome == "cancelled":
            return "no_reward", {"outcome": "cancelled", "rule": "cancelled rollouts are never graded"}
        if reward is None and self.token_level:
            return "no_reward", {"reward_sources": list(cfg.reward_sources) if cfg.reward_sources else None}
        if info.group_id is not None and info.group_id not in self.groups:
            return "missing_data", {"group_id": info.group_id, "rule": "the rollout's group row is not in the store"}
        return None

    def _stale(self, info: RolloutInfo, calls: list[StoredCall]) -> dict | None:
        if self.cfg.max_policy_lag is None or self.current is None:
            return None
        versions = [info.policy_version_id] + [c.policy_version_id for c in calls]
        lag = policy_lag(self.order, self.current, versions)
        if lag is None:
            if not any(versions):
                return None
            return {"rule": "policy version unknown to the store", "versions": sorted({v for v in versions if v})}
        if lag > self.cfg.max_policy_lag:
            return {"lag": lag, "max_policy_lag": self.cfg.max_policy_lag, "current": self.current}
        return None

    def __iter__(self) -> Iterator[GroupPlan]:
        for chunk in self._chunks():
            groups = {key: sorted(self.buckets[key], key=lambda r: r.id) for key in chunk}
            infos = [info for members in groups.values() for info in members]
            rewards = self.store.latest_rewards([i.id for i in infos], sources=self.cfg.reward_sources, as_of=self.wm)
            rules = {i.id: self._rollout_rule(i, rewards.get(i.id)) for i in infos}
            calls = self.store.calls_by_rollout([i.id for i in infos if rules[i.id] is None], as_of=self.wm)
            for key, members in groups.items():
                plan = self._group(key, members, rewards, rules, calls)
                if plan is not None:
                    yield plan

    def _chunks(self) -> Iterator[list[str]]:
        """Group keys in order, in runs of about ``batch_rollouts`` rollouts (a group is never split): the store
        reads the rewards and calls of a run in one query each, and only one run's calls are in memory."""
        chunk: list[str] = []
        n = 0
        for key in sorted(self.buckets):
            if chunk and n + len(self.buckets[key]) > self.batch_rollouts:
                yield chunk
                chunk, n = [], 0
            chunk.append(key)
            n += len(self.buckets[key])
        if chunk:
            yield chunk

    def _group(self, key: str, infos: list[RolloutInfo], rewards: dict[str, RewardInfo],
               rules: dict[str, tuple[str, dict] | None], calls_of: dict[str, list[StoredCall]]) -> GroupPlan | None:
        cfg = self.cfg
        group = self.groups.get(key)
        survivors: list[RolloutPlan] = []
        for info in infos:
            reward, rule = rewards.get(info.id), rules[info.id]
            if rule:
                self._exclude(rule[0], info.id, **rule[1])
                continue
            calls = calls_of.pop(info.id)
            stale = self._stale(info, calls)
            if stale:
                self._exclude("stale_policy", info.id, **stale)
                continue
            survivors.append(RolloutPlan(info, calls, reward))
        if not survivors:
            return None
        if self.token_level:
            target = group["target_size"] if group else 1
            need = cfg.min_group_size if cfg.min_group_size is not None else target
            if len(survivors) < need:
                for rp in survivors:
                    self._exclude("incomplete_group", rp.info.id, group_id=key, finished=len(survivors),
                                  target_size=target, min_group_size=need)
                return None
        plan = GroupPlan(key, group, survivors)
        for rp in survivors:
            self.tally.calls += len(rp.calls)
            if self.token_level:
                rp.recon = reconstruct_rollout(rp.calls, keep_truncated=cfg.keep_truncated)
                self.tally.merged += rp.recon.merged
                for ex in rp.recon.excluded:
                    self._exclude(ex.reason, rp.info.id, ex.call_id, **ex.detail)
            else:
                rp.convs, excluded = sft_conversations(rp.calls, keep_truncated=cfg.keep_truncated)
                for ex in excluded:
                    self._exclude(ex.reason, rp.info.id, ex.call_id, **ex.detail)
        if self.token_level:
            res = group_advantages([rp.reward.value for rp in survivors], cfg.grpo())
            for rp, adv in zip(survivors, res.advantages):
                rp.advantage = adv
            plan.note = res.note
            self.tally.singleton_groups += res.note == "singleton"
            self.tally.all_equal_groups += res.note == "all_equal"
        self.tally.groups += 1
        return plan


__all__ = ["PURPOSES", "CallExclusion", "Exclusion", "ExportConfig", "GroupPlan", "Planner", "RolloutPlan", "Tally", "rollout_purpose"]
