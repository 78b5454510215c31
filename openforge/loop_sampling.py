"""What one GRPO round trains on: the round's groups, drawn from the train pool, and (with the recipe's
``signal_groups``) DAPO's dynamic sampling.

A group whose rollouts all got the same reward has every advantage 0 and teaches nothing; at this model's scale most
groups are like that (the seed-1 store of stop 49: 13 of 24 groups had any spread, and one round trained on 2). So
with ``signal_groups = N`` a round keeps drawing the pool's next ``tasks_per_round`` tasks, one group each, until it
holds N groups with a spread of reward or has drawn ``max_draws`` times, and trains on the first N such groups
(DAPO, Yu et al. 2025, section 3.2: over-sample and filter until the batch is full of groups with signal). Sampling
is the cheaper half of a round on a CPU (64 rollouts in 77-106 s against 150-211 s to update on 40 of them), and
capping at N keeps the update's cost the same from round to round. With ``signal_groups = 0`` a round is one draw,
trained whole (the export still drops the equal groups), as before.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from .loop_tasks import task_kind

UNGRADED = ("infra_error", "cancelled")


def draw_tasks(pool: list, start: int, k: int) -> list:
    """``k`` tasks of the pool from position ``start`` on, going round it."""
    if not pool:
        return []
    start %= len(pool)
    ring = pool[start:] + pool[:start]
    return (ring * (k // len(pool) + 1))[:k]


def spread_groups(results, success_only: bool = False) -> list[str]:
    """The groups (in the order their rollouts came back) whose graded rollouts got more than one reward: the
    only ones whose advantages are not all 0. ``success_only`` compares success alone, as the export then does.
    The recipe's ``call_cost`` shaping is not applied here: a group whose rollouts all got one reward with different
    call counts has advantages in the export but does not count as signal for the draws."""
    rewards: dict[str, list[float]] = defaultdict(list)
    for r in results:
        if r.outcome in UNGRADED or not r.group_id:
            continue
        value = float(r.outcome == "success") if success_only else float(r.reward or 0.0)
        rewards[r.group_id].append(value)
    return [g for g, vs in rewards.items() if len(vs) > 1 and max(vs) > min(vs)]


@dataclass
class RoundDraws:
    """The rollouts one round drew, and which of them it trains on."""
    runs: list[str] = field(default_factory=list)
    summaries: list = field(default_factory=list)
    spread: list[str] = field(default_factory=list)   # every group with a spread of reward, in draw order
    spread_by_draw: list[int] = field(default_factory=list)
    keep: list[str] | None = None                      # the groups trained on; None: every group of every run
    kinds: dict[str, str] = field(default_factory=dict)  # task id -> its family and steps (``task_kind``)

    def by_kind(self, groups: list[str] | None = None) -> dict[str, int]:
        """How many of ``groups`` (default: every group drawn) each kind of task had, kinds sorted by name: what a
        round trained on, by family and number of steps."""
        task_of = {r.group_id: r.task_id for s in self.summaries for r in s.results if r.group_id}
        wanted = task_of if groups is None else groups
        return dict(sorted(Counter(self.kinds.get(task_of.get(g), "other") for g in wanted).items()))

    @property
    def kept(self) -> list[str]:
        """The groups the round trains on: ``keep``, or without dynamic sampling every group with a spread (the
        export drops the rest)."""
        return self.spread if self.keep is None else self.keep

    def kept_text(self) -> str:
        """``"check 2-step 3, files 1-step 5"``: the kept groups by kind, for the loop's console."""
        return ", ".join(f"{kind} {n}" for kind, n in self.by_kind(self.kept).items()) or "none"

    def where(self) -> str:
        """The export's ``--where``: the round's runs, and with dynamic sampling only the groups kept."""
        runs = _literals(self.runs)
        if self.keep is None:
            return f"run_id = '{self.runs[0]}'" if len(self.runs) == 1 else f"run_id in ({runs})"
        return f"run_id in ({runs}) and group_id in ({_literals(self.keep)})"

    def as_dict(self) -> dict:
        return {"draws": len(self.runs), "rollouts": sum(len(s.results) for s in self.summaries),
                "groups": sum(len({r.group_id for r in s.results}) for s in self.summaries),
                "spread_groups": len(self.spread), "spread_by_draw": self.spread_by_draw,
                "kept_groups": len(self.kept), "runs": self.runs, "drawn_by_kind": self.by_kind(),
                "spread_by_kind": self.by_kind(self.spread), "kept_by_kind": self.by_kind(self.kept)}


def _literals(values) -> str:
    """The ``--where`` language's quoted strings ('' escapes a quote), comma-separated."""
    return ", ".join("'" + str(v).replace("'", "''") + "'" for v in values)


class RoundSampler:
    """Draws each round's groups from the pool, where the last draw stopped (so no task repeats before the pool
    is gone round)."""

    def __init__(self, pool: list, recipe):
        self.pool, self.recipe, self.cursor = pool, recipe, 0

    def draw(self, rollouts, name: str) -> RoundDraws:
        """``rollouts(tasks, name)`` runs one group per task and returns its run summary."""
        recipe, out = self.recipe, RoundDraws()
        limit = recipe.max_draws if recipe.signal_groups else 1
        while len(out.runs) < limit:
            tasks = draw_tasks(self.pool, self.cursor, recipe.tasks_per_round)
            self.cursor += len(tasks)
            out.kinds.update((getattr(t, "id", t), task_kind(t)) for t in tasks)
            label = name if not out.runs else f"{name} draw {len(out.runs) + 1}"
            summary = rollouts(tasks, label)
            out.runs.append(summary.run_id)
            out.summaries.append(summary)
            found = spread_groups(summary.results, recipe.success_only)
            out.spread += found
            out.spread_by_draw.append(len(found))
            if not recipe.signal_groups or len(out.spread) >= recipe.signal_groups:
                break
        if recipe.signal_groups:
            out.keep = out.spread[:recipe.signal_groups]
        return out
