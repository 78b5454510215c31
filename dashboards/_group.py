"""A GRPO group side by side (the Group page): each rollout's reward (the latest of the chosen sources), its GRPO
advantage (``learner.group_advantages`` over the group's graded rollouts, as an export computes it before its
selection rules), steps, tools, and where the rollouts' actions first diverge.

An action is a tool call's name and raw arguments, in order. The rollouts diverge at the first action index where
they do not all take the same action (a rollout that already stopped counts as a different action there).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from forge_store import RolloutInfo, Store
from learner import group_advantages, tool_steps

STOPPED = "(stopped)"


@dataclass
class GroupView:
    rows: list[dict]  # one per rollout, in id order
    actions: list[dict]  # one per action index: {"action": n, rollout id: "name args", ...}
    diverge_at: int | None  # 1-based action index where they first differ (None: they never do)
    note: str | None  # the group's advantage note (singleton, all_equal)


def action_label(name: str, arguments: str, width: int = 60) -> str:
    text = f"{name} {arguments}".strip()
    return text if len(text) <= width else text[: width - 3] + "..."


def group_view(store: Store, rollouts: list[RolloutInfo], reward_sources=None) -> GroupView:
    ids = [r.id for r in rollouts]
    rewards = store.latest_rewards(ids, sources=reward_sources)
    summaries = store.call_summaries(ids)
    graded = [r.id for r in rollouts if r.id in rewards]
    adv, note = {}, None
    if graded:
        res = group_advantages([rewards[i].value for i in graded])
        adv, note = dict(zip(graded, res.advantages)), res.note
    seqs: dict[str, list[str]] = {}
    rows = []
    for r in rollouts:
        steps = tool_steps(summaries.get(r.id, []))
        seqs[r.id] = [action_label(s.name, s.arguments_raw) for s in steps]
        rows.append({"rollout": r.id, "outcome": r.outcome or r.status,
                     "reward": rewards[r.id].value if r.id in rewards else None, "advantage": adv.get(r.id),
                     "calls": len(summaries.get(r.id, [])), "tool calls": len(steps),
                     "failed tool calls": sum(s.failed for s in steps),
                     "tools": ", ".join(f"{n} x{c}" for n, c in Counter(s.name for s in steps).most_common()),
                     "timeline": f"?page=Timeline&rollout={r.id}"})
    longest = max((len(s) for s in seqs.values()), default=0)
    at = lambda seq, k: seq[k] if k < len(seq) else STOPPED  # noqa: E731
    diverge = next((k + 1 for k in range(longest) if len({at(s, k) for s in seqs.values()}) > 1), None)
    for row in rows:
        row["action at divergence"] = at(seqs[row["rollout"]], diverge - 1) if diverge else None
    actions = [{"action": k + 1, **{rid: at(seq, k) for rid, seq in seqs.items()}} for k in range(longest)]
    return GroupView(rows, actions, diverge, note)
