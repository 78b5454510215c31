"""Selection: which rollouts become training data, grouped for GRPO, and a stored reason for every one that does not.

Each rollout keeps its first, true reason: facts about the rollout come before the export's own choices. Rules, in
the order they are applied to each finished rollout (first match wins; unfinished rollouts as of the watermark are
counted, not excluded: a later export takes them):

0. The run's purpose (``rollout_purpose``: the rollout's ``metadata["purpose"]``, ``train`` when absent):
   ``evaluation`` for every ``eval`` rollout, whatever the format (held-out measurements never become training
   data); ``teacher`` for ``teacher`` rollouts in a token-level format (veRL, TRL: a teacher's calls are not the
   policy's samples, so they have no place in a policy-gradient shard; SFT shards take them); ``filtered`` for a
   purpose this version does not know (never trained on by guess).
1. ``infra_error``: outcome ``infra_error`` (invariant 6: never a zero reward).
2. ``no_reward``: outcome ``cancelled`` (never graded), or no reward row from the allowed sources.
3. ``missing_data``: the rollout names a group that is not in the store.
4. ``filtered``: ``policy_timeout`` rollouts when configured off.

(``erased``: a rollout the store held at the watermark and ``openforge erase`` removed since has no rows left to
read; it gets this exclusion, naming its tombstone, instead of the reason it had.)

A rollout past these has a reward that is a fair sample of the policy: it belongs to its group as recorded.

5. ``filtered``: ``--group-where`` (a group is kept whole when any of its rollouts matches, else left out whole)
   or ``--where`` (rollout by rollout). In a GRPO format a ``--where`` that keeps some rollouts of a group and
   removes others is refused before anything is written (advantages need whole groups), unless
   ``allow_partial_groups``: then the removed rollouts still count in their group's statistics (advantages are
   never computed over a filtered subset), they only get no rows.
6. ``stale_policy``: the oldest policy version of the rollout (its own or any call's) trails the current one by
   more than ``max_policy_lag`` versions (off by default); not in the group's statistics.
7. ``redacted``: a call of the rollout had a secret redacted (its metadata's ``redacted`` lists the rules): its
   text was redacted but its token ids still carry the secret (invariant 9), so the rollout gets no rows unless
   ``include_redacted``; it still counts in its group's statistics.
8. ``incomplete_group``: fewer rollouts in the group's statistics than ``min_group_size`` (default: the group's
   target size).

Rules 2 and 8 do not apply to the SFT format (it needs no reward). Calls are then excluded one by one:
``harness_self_call`` (a harness's own title, routing or summary call, unless ``include_self_calls``), ``store_damaged`` (the store cannot give the call back: the database refused it, or its stored delta lost its
base; the rollout's other calls are used), ``infra_error``, ``not_token_exact``, ``truncated``,
``logprob_mismatch`` (see :mod:`learner._reconstruct`; the SFT format's own rules are in :mod:`learner._sft`); a
rollout whose calls are all excluded still counts in its group's GRPO statistics, since its reward is a fair
sample of the policy. A rollout without a group is a group of its own (target size 1).

A rollout's reward is the one that counts by the store's rule (``Store.latest_rewards``: its latest from
``reward_sources``). Of the whole store the planner keeps only each group's number of finished rollouts
(``Store.group_index``: one aggregate query, no row per rollout); rollouts, group rows, rewards and calls are read
for runs of groups at once (``Store.group_rollouts``, ``Store.lineage(ids=)``, ``Store.latest_rewards``, and
``Store.token_calls`` for a token-level format: token arrays as bytes, reconstructed by
:func:`learner._reconstruct.reconstruct_tokens`; ``Store.calls_by_rollout`` for SFT, or with ``batched=False``,
the reference path the batched one is tested against), so memory is bounded by a run.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from forge_store import RewardInfo, RolloutInfo, Store, StoredCall, TokenCall, erased_rollouts

from ._export_config import (PURPOSES, Exclusion, ExportConfig, ExportError, redactions, rollout_purpose,
                             split_self_calls, where_row)
from ._grpo import group_advantages, policy_lag, policy_order, segment_values
from ._query import parse_where
from ._reconstruct import CallExclusion, Reconstruction, reconstruct_rollout, reconstruct_tokens
from ._sft import Conversation, sft_conversations


AnyCall = StoredCall | TokenCall  # TokenCall: a token-level format's batched reads


@dataclass
class RolloutPlan:
    info: RolloutInfo
    calls: list[AnyCall]
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


RUN_ROLLOUTS = 256  # rollouts read and planned together (a run of whole groups): one query each per run
Screen = tuple[dict[str, tuple[str, dict]], list[RolloutInfo], dict[str, dict]]
# a run of groups as read: (groups, their group rows, rewards, screens, calls, damage)
_Run = tuple[dict[str, list[RolloutInfo]], dict[str, dict], dict[str, RewardInfo], dict[str, Screen],
             dict[str, list[AnyCall]], dict[str, list[dict]]]


class Planner:
    """Walks the store as of one watermark and yields groups ready to write, in (group, rollout) order."""

    def __init__(self, store: Store, cfg: ExportConfig, watermark: int,
                 on_exclusion: Callable[[Exclusion], None] | None = None, *, batch_rollouts: int | None = None,
                 batched: bool = True):
        self.store, self.cfg, self.wm = store, cfg, watermark
        self.batch_rollouts = batch_rollouts or RUN_ROLLOUTS
        self.on_exclusion = on_exclusion or (lambda e: None)
        self.tally = Tally()
        self.pred = parse_where(cfg.where) if cfg.where else None
        self.group_pred = parse_where(cfg.group_where) if cfg.group_where else None
        self.wants_tags = any("tag" in re.findall(r"[A-Za-z_]+", w or "") for w in (cfg.where, cfg.group_where))
        self.token_level = cfg.format != "sft"
        self.token_reads = self.token_level and batched
        self.partial = self.token_level and cfg.allow_partial_groups
        pvs = store.lineage("policy_versions", as_of=watermark)
        self.policies = {p["id"]: p for p in pvs}
        self.order = policy_order(pvs)
        self.current = cfg.current_policy or (max(self.order, key=self.order.get) if self.order else None)
        if cfg.current_policy and cfg.current_policy not in self.order:
            raise ValueError(f"--current-policy {cfg.current_policy!r} is not a policy version in the store as of "
                             f"watermark {watermark}; known: {', '.join(sorted(self.order)) or '(none)'}")
        self.tasks = {t["id"]: t for t in store.lineage("tasks", as_of=watermark)}
        self.harnesses = {h["id"]: h for h in store.lineage("harnesses", as_of=watermark)}
        # what the planner keeps of the whole store: each group key's number of finished rollouts (a rollout
        # without a group is a group of its own, keyed "~<id>"), never a row per rollout; a run reads its groups'
        # rollouts and group rows when it comes (memory bounded by a run, not by the store)
        self.sizes: dict[str, int] = defaultdict(int)
        self.loose: dict[str, str] = {}  # "~<id>" -> the rollout id of a rollout without a group
        for group_id, rid, finished, seen in store.group_index(as_of=watermark):
            self.tally.rollouts_seen += seen
            self.tally.unfinished += seen - finished
            if not finished:
                continue
            key = group_id if rid is None else f"~{rid}"
            self.sizes[key] += finished
            if rid is not None:
                self.loose[key] = rid
        self.total = sum(self.sizes.values())
        # rollouts the store held at the watermark and an erasure removed since: each keeps an exclusion row
        for rid, (group_id, tombstone) in sorted(erased_rollouts(store, as_of=watermark).items()):
            self._exclude("erased", rid, tombstone=tombstone, group_id=group_id)
        if self.pred is not None and self.token_level and not cfg.allow_partial_groups:
            self._refuse_split_groups()

    def _exclude(self, reason: str, rollout_id: str | None, call_id: str | None = None, **detail) -> None:
        self.tally.exclusions[reason] += 1
        self.on_exclusion(Exclusion(reason, rollout_id, call_id, detail))

    def _rollout_rule(self, info: RolloutInfo, reward: RewardInfo | None,
                      groups: dict[str, dict]) -> tuple[str, dict] | None:
        """Rules 0-4 of the module docstring: facts that keep a rollout out of its group's statistics."""
        cfg = self.cfg
        purpose = rollout_purpose(info)
        if purpose == "eval":
            return "evaluation", {"purpose": purpose, "rule": "evaluation rollouts are never training data"}
        if purpose == "teacher" and self.token_level:
            return "teacher", {"purpose": purpose, "format": cfg.format,
                               "rule": "a teacher's demonstrations go to SFT shards, never to a policy-gradient shard"}
        if purpose not in PURPOSES:
            return "filtered", {"purpose": purpose, "rule": f"a run's purpose is one of {', '.join(PURPOSES)}"}
        if info.outcome == "infra_error":
            return "infra_error", {"outcome_detail": info.outcome_detail}
        if info.outcome == "cancelled":
            return "no_reward", {"outcome": "cancelled", "rule": "cancelled rollouts are never graded"}
        if reward is None and self.token_level:
            return "no_reward", {"reward_sources": list(cfg.reward_sources) if cfg.reward_sources else None}
        if info.group_id is not None and info.group_id not in groups:
            return "missing_data", {"group_id": info.group_id, "rule": "the rollout's group row is not in the store"}
        if info.outcome == "policy_timeout" and not cfg.train_policy_timeouts:
            return "filtered", {"rule": "policy_timeout rollouts are configured off"}
        return None

    def _screen(self, members: list[RolloutInfo], rewards: dict[str, RewardInfo], groups: dict[str, dict]) -> Screen:
        """(rollout id -> its rule 0-4 exclusion; the group's other rollouts; rollout id -> why --group-where or
        --where filters it)."""
        rules, candidates, filtered = {}, [], {}
        for info in members:
            rule = self._rollout_rule(info, rewards.get(info.id), groups)
            if rule:
                rules[info.id] = rule
            else:
                candidates.append(info)
        if self.group_pred is None and self.pred is None:
            return rules, candidates, filtered
        rows = {i.id: where_row(i, rewards.get(i.id)) for i in candidates}
        if self.wants_tags:
            for i in candidates:   # the tags of the rollout's human labels (``tag`` in --where)
                rows[i.id]["tag"] = sorted({t for r in self.store.rewards(i.id, as_of=self.wm) if r.source == "human"
                                            for t in (r.detail or {}).get("tags") or ()})
        if self.group_pred is not None and not any(self.group_pred(rows[i.id]) for i in candidates):
            for info in candidates:
                filtered[info.id] = {"group_where": self.cfg.group_where, "rule": "no rollout of the group "
                                     "matches --group-where: the group is left out whole"}
        elif self.pred is not None:
            for info in candidates:
                if not self.pred(rows[info.id]):
                    filtered[info.id] = {"where": self.cfg.where}
        return rules, candidates, filtered

    def _refuse_split_groups(self) -> None:
        """ExportError when ``--where`` keeps part of a group in a GRPO format, before anything is written."""
        splits: list[tuple[str, int, int]] = []
        for chunk in self._chunks():
            groups, rows = self._read_groups(chunk)
            ids = [i.id for members in groups.values() for i in members]
            rewards = self.store.latest_rewards(ids, sources=self.cfg.reward_sources, as_of=self.wm)
            for key, members in groups.items():
                _, candidates, filtered = self._screen(members, rewards, rows)
                if 0 < len(filtered) < len(candidates):
                    splits.append((key, len(filtered), len(candidates)))
        if not splits:
            return
        names = ", ".join(k for k, _, _ in splits[:5]) + (f" and {len(splits) - 5} more" if len(splits) > 5 else "")
        raise ExportError(
            f"--where {self.cfg.where!r} removed {sum(r for _, r, _ in splits)} of {sum(n for _, _, n in splits)} "
            f"rollouts from {len(splits)} group(s) ({names}) and kept the rest; a {self.cfg.format} export needs "
            "whole GRPO groups (advantages over a filtered subset are measured against the wrong baseline). "
            f"Keep or drop whole groups with --group-where {self.cfg.where!r} (a group is kept whole when any of its "
            "rollouts matches), or pass --allow-partial-groups to export only the matching rollouts with advantages "
            "computed over their whole recorded groups.")

    def _stale(self, info: RolloutInfo, calls: list[AnyCall]) -> dict | None:
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
        for _, plans in self.runs():
            yield from plans

    def runs(self, part: int = 0, parts: int = 1) -> Iterator[tuple[int, list[GroupPlan]]]:
        """(index, its planned groups) of the runs of groups whose index is ``part`` modulo ``parts`` (every run by
        default), in order. The next run is read while this one is planned (a reader thread: the database driver
        releases the GIL while the database works, so reads overlap with reconstruction)."""
        mine = ((i, c) for i, c in enumerate(self._chunks()) if i % parts == part)
        with ThreadPoolExecutor(1, thread_name_prefix="openforge-export-read") as reader:
            item = next(mine, None)
            ahead = reader.submit(self._read, item[1] if item else None)
            while item is not None:
                groups, rows, rewards, screens, calls, damage = ahead.result()
                following = next(mine, None)
                ahead = reader.submit(self._read, following[1] if following else None)
                plans = [self._group(key, members, rows.get(key), rewards, screens[key], calls, damage)
                         for key, members in groups.items()]
                yield item[0], [p for p in plans if p is not None]
                item = following

    def n_runs(self) -> int:
        return sum(1 for _ in self._chunks())

    def _read(self, chunk: list[str] | None) -> _Run | None:
        """Everything the planning of a run of groups reads from the store (None for no run): no writes here, so
        exclusions are still recorded in order by the planning thread."""
        if chunk is None:
            return None
        groups, rows = self._read_groups(chunk)
        infos = [info for members in groups.values() for info in members]
        rewards = self.store.latest_rewards([i.id for i in infos], sources=self.cfg.reward_sources, as_of=self.wm)
        screens = {key: self._screen(members, rewards, rows) for key, members in groups.items()}
        # filtered members still count in their group's statistics: they need their calls where those decide it
        # (staleness; the number of calls under efficiency shaping)
        stats_only = self.partial and (self.cfg.max_policy_lag is not None or bool(self.cfg.call_cost))
        wanted = [i.id for _, candidates, filtered in screens.values() for i in candidates
                  if i.id not in filtered or stats_only]
        damage: dict[str, list[dict]] = {}
        read = self.store.token_calls if self.token_reads else self.store.calls_by_rollout
        return groups, rows, rewards, screens, read(wanted, as_of=self.wm, damage=damage), damage

    def _read_groups(self, chunk: list[str]) -> tuple[dict[str, list[RolloutInfo]], dict[str, dict]]:
        """(group key -> its finished rollouts (ordered by id), group id -> its group row), read for a run of
        groups at once."""
        by_group = self.store.group_rollouts(chunk, as_of=self.wm)  # a "~<id>" key names no group
        single = self.store.rollouts([self.loose[k] for k in chunk if k in self.loose], as_of=self.wm)
        out = {}
        for key in chunk:
            infos = [i for i in by_group.get(key, ()) if i.status == "finished"]
            if key in self.loose and key[1:] in single and single[key[1:]].status == "finished":
                infos = sorted(infos + [single[key[1:]]], key=lambda i: i.id)
            out[key] = infos
        named = {i.group_id for infos in out.values() for i in infos if i.group_id is not None}
        groups = {g["id"]: g for g in self.store.lineage("rollout_groups", as_of=self.wm, ids=list(named))}
        return out, groups

    def _chunks(self) -> Iterator[list[str]]:
        """Group keys in order, in runs of about ``batch_rollouts`` rollouts (a group is never split): the store
        reads the rewards and calls of a run in one query each, and only one run's calls are in memory."""
        chunk: list[str] = []
        n = 0
        for key in sorted(self.sizes):
            if chunk and n + self.sizes[key] > self.batch_rollouts:
                yield chunk
                chunk, n = [], 0
            chunk.append(key)
            n += self.sizes[key]
        if chunk:
            yield chunk

    def _members(self, infos: list[RolloutInfo], rewards: dict[str, RewardInfo], screen: Screen,
                 calls_of: dict[str, list[AnyCall]]) -> tuple[list[RolloutPlan], list[RolloutPlan]]:
        """Rules 0-7 applied to a group: (the rollouts in its statistics, those of them that may get rows)."""
        rules, candidates, filtered = screen
        for info in infos:
            if info.id in rules:
                self._exclude(rules[info.id][0], info.id, **rules[info.id][1])
        scored: list[RolloutPlan] = []
        shown: list[RolloutPlan] = []
        for info in candidates:
            if info.id in filtered:
                self._exclude("filtered", info.id, **filtered[info.id])
                if not self.partial:
                    continue
            rp = RolloutPlan(info, calls_of.pop(info.id, []), rewards.get(info.id))
            stale = self._stale(info, rp.calls)
            if stale:
                if info.id not in filtered:
                    self._exclude("stale_policy", info.id, **stale)
                continue
            scored.append(rp)
            if info.id in filtered:
                continue
            hidden = redactions(rp.calls)
            if hidden and not self.cfg.include_redacted:
                self._exclude("redacted", info.id, calls=sorted(hidden), rules=sorted({r for v in hidden.values()
                                                                                       for r in v}),
                              rule="a call's text was redacted but its token ids still carry the secret; pass "
                                   "--include-redacted to export it anyway")
                continue
            shown.append(rp)
        return scored, shown

    def _group(self, key: str, infos: list[RolloutInfo], group: dict | None, rewards: dict[str, RewardInfo],
               screen: Screen, calls_of: dict[str, list[AnyCall]], damage: dict[str, list[dict]]) -> GroupPlan | None:
        cfg = self.cfg
        scored, shown = self._members(infos, rewards, screen, calls_of)
        if not shown:
            return None
        if self.token_level:
            target = group["target_size"] if group else 1
            need = cfg.min_group_size if cfg.min_group_size is not None else target
            if len(scored) < need:
                for rp in shown:
                    self._exclude("incomplete_group", rp.info.id, group_id=key, finished=len(scored),
                                  target_size=target, min_group_size=need)
                return None
        plan = GroupPlan(key, group, shown)
        for rp in shown:
            self.tally.calls += len(rp.calls)
            for d in damage.get(rp.info.id, ()):
                self._exclude("store_damaged", rp.info.id, d["call_id"], seq=d["seq"], why=d["why"])
            calls, marked = split_self_calls(rp.calls, cfg.include_self_calls)
            for call_id, kind in marked.items():
                self._exclude("harness_self_call", rp.info.id, call_id, kind=kind)
            if self.token_level:
                rebuild = reconstruct_tokens if self.token_reads else reconstruct_rollout
                rp.recon = rebuild(calls, keep_truncated=cfg.keep_truncated)
                self.tally.merged += rp.recon.merged
                for ex in rp.recon.excluded:
                    self._exclude(ex.reason, rp.info.id, ex.call_id, **ex.detail)
            else:
                rp.convs, excluded = sft_conversations(calls, keep_truncated=cfg.keep_truncated)
                for ex in excluded:
                    self._exclude(ex.reason, rp.info.id, ex.call_id, **ex.detail)
        if self.token_level:  # over the group as recorded: every rollout in its statistics, shown or not
            res = group_advantages([cfg.shaped(rp.reward.value, len(rp.calls)) for rp in scored], cfg.grpo())
            for rp, adv in zip(scored, res.advantages):
                rp.advantage = adv
            plan.note = res.note
            self.tally.singleton_groups += res.note == "singleton"
            self.tally.all_equal_groups += res.note == "all_equal"
        self.tally.groups += 1
        return plan


__all__ = ["PURPOSES", "CallExclusion", "Exclusion", "ExportConfig", "ExportError", "GroupPlan", "Planner", "RolloutPlan",
           "Tally", "redactions", "rollout_purpose"]
