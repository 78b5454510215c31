"""Two policy versions compared on their evaluation rollouts: every rubric's two values, the difference and a 95%
interval that respects the pairing.

Both versions are usually evaluated on the same held-out tasks, so the comparison is **paired by task**: a task is
the unit that is resampled (a percentile bootstrap over tasks, stratified by ``stratum``, e.g. the seed of a
generated set, so that pooled comparisons keep each seed's weight), and a task's rollouts under A and under B stay
together. Two independent intervals would throw the pairing away and be much wider: most of the variance in a
held-out success rate is which tasks happen to be drawn. Tasks that only one version was evaluated on are dropped
from a paired comparison (``n_tasks`` says how many remain); with no task in common the rubric is resampled per
version independently (``paired`` false).

For success on one rollout per task, McNemar's exact test on the discordant tasks (won by one version, lost by the
other) gives a p-value beside the interval.

Rubrics (the rules are ``learner._rubrics``'s): success rate, pass@k and pass^k (over tasks with at least k
rollouts), success by family (the task's domain) and by difficulty, each tool's share of tool calls, tool coverage,
self-verification rate (rollouts whose every written path was read back, of rollouts that wrote), inspect-first rate
(rollouts whose first tool call only looks, of rollouts with a tool call), made-up name rate (file names in tool
calls that nothing the rollout was shown held, of all file names in tool calls), error-recovery
rate (failed tool calls followed by a different successful one), step efficiency (over passed rollouts), tool
calls per rollout; with more than one family, the inspect-first and error-recovery rates of each family's tasks
alone (a family built to reward looking first or recovering shows its change there, not diluted by the others), and
each family's made-up name rate.
Rates are pooled over the resampled tasks (ratio of sums), as ``openforge analyze`` pools them.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ._stats import pass_at_k, pass_hat_k

Z = 1.959963984540054


@dataclass
class TaskAgg:
    """What one version's rollouts of one task add up to."""

    family: str = "(none)"
    difficulty: str = "(none)"
    n: int = 0
    passed: int = 0
    tool_calls: int = 0
    tools: Counter = field(default_factory=Counter)
    wrote: int = 0
    verified: int = 0
    failed: int = 0
    recovered: int = 0
    unparsed: int = 0
    tooled: int = 0            # rollouts with a tool call
    inspected_first: int = 0   # of them, those whose first tool call only looks
    names: int = 0             # file names in tool calls
    made_up: int = 0           # of them, names nothing shown before held
    coverage: list = field(default_factory=list)
    efficiency: list = field(default_factory=list)

    def add(self, facts) -> None:
        r = facts.rubrics
        self.n += 1
        self.unparsed += r.unparsed
        self.passed += int(facts.passed)
        self.tool_calls += r.n_tool_calls
        self.tools.update(r.tool_counts)
        if r.wrote:
            self.wrote += 1
            self.verified += int(bool(r.self_verified))
        self.failed += r.failed
        self.recovered += r.recovered
        if r.inspected_first is not None:
            self.tooled += 1
            self.inspected_first += int(r.inspected_first)
        self.names += r.names
        self.made_up += r.made_up
        if r.coverage is not None:
            self.coverage.append(r.coverage)
        if facts.passed and r.efficiency is not None:
            self.efficiency.append(r.efficiency)

    def as_dict(self) -> dict:
        """JSON-ready (the tool counter as a plain mapping); :meth:`from_dict` reads it back unchanged. Not
        ``dataclasses.asdict``: it rebuilds a Counter from (key, value) pairs, counting the pairs."""
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "tools": dict(self.tools)}

    @classmethod
    def from_dict(cls, doc: Mapping) -> TaskAgg:
        unknown = set(doc) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"task aggregate has unknown fields {sorted(unknown)}: expected some of "
                             f"{sorted(cls.__dataclass_fields__)} (written by TaskAgg.as_dict)")
        return cls(**{**doc, "tools": Counter(doc.get("tools") or {}),
                      "coverage": list(doc.get("coverage") or []), "efficiency": list(doc.get("efficiency") or [])})


Metric = Callable[[Sequence[TaskAgg]], "float | None"]


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _mean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def metrics(tool_names: Iterable[str], families: Iterable[str], difficulties: Iterable[str],
            ks: Sequence[int] = (1,)) -> dict[str, Metric]:
    """Name -> function of a list of task aggregates (one version's), in the order the table prints them."""
    out: dict[str, Metric] = {"success_rate": lambda ts: _ratio(sum(t.passed for t in ts), sum(t.n for t in ts))}
    for k in (k for k in ks if k > 1):   # pass@1 and pass^1 are the success rate
        out[f"pass@{k}"] = lambda ts, k=k: _mean(pass_at_k(t.n, t.passed, k) for t in ts if t.n >= k)
        out[f"pass^{k}"] = lambda ts, k=k: _mean(pass_hat_k(t.n, t.passed, k) for t in ts if t.n >= k)
    for fam in sorted(families):
        out[f"success[{fam}]"] = lambda ts, fam=fam: _ratio(sum(t.passed for t in ts if t.family == fam),
                                                           sum(t.n for t in ts if t.family == fam))
    for diff in sorted(difficulties):
        out[f"success[difficulty {diff}]"] = lambda ts, diff=diff: _ratio(
            sum(t.passed for t in ts if t.difficulty == diff), sum(t.n for t in ts if t.difficulty == diff))
    out.update({
        "tool_calls_per_rollout": lambda ts: _ratio(sum(t.tool_calls for t in ts), sum(t.n for t in ts)),
        "self_verification_rate": lambda ts: _ratio(sum(t.verified for t in ts), sum(t.wrote for t in ts)),
        "recovery_rate": lambda ts: _ratio(sum(t.recovered for t in ts), sum(t.failed for t in ts)),
        "inspect_first_rate": lambda ts: _ratio(sum(t.inspected_first for t in ts), sum(t.tooled for t in ts)),
        "made_up_name_rate": lambda ts: _ratio(sum(t.made_up for t in ts), sum(t.names for t in ts)),
        "failed_tool_calls_per_rollout": lambda ts: _ratio(sum(t.failed for t in ts), sum(t.n for t in ts)),
        "unparsed_tool_calls_per_rollout": lambda ts: _ratio(sum(t.unparsed for t in ts), sum(t.n for t in ts)),
        "tool_coverage": lambda ts: _mean(x for t in ts for x in t.coverage),
        "step_efficiency": lambda ts: _mean(x for t in ts for x in t.efficiency),
    })
    if len(set(families)) > 1:   # the behaviours a family is built to reward, on that family's tasks alone
        for fam in sorted(families):
            out[f"inspect_first_rate[{fam}]"] = lambda ts, fam=fam: _ratio(
                sum(t.inspected_first for t in ts if t.family == fam), sum(t.tooled for t in ts if t.family == fam))
            out[f"recovery_rate[{fam}]"] = lambda ts, fam=fam: _ratio(
                sum(t.recovered for t in ts if t.family == fam), sum(t.failed for t in ts if t.family == fam))
            out[f"made_up_name_rate[{fam}]"] = lambda ts, fam=fam: _ratio(
                sum(t.made_up for t in ts if t.family == fam), sum(t.names for t in ts if t.family == fam))
    for name in sorted(tool_names):
        out[f"tool_share[{name}]"] = lambda ts, name=name: _ratio(sum(t.tools[name] for t in ts),
                                                                 sum(t.tool_calls for t in ts))
    return out


@dataclass(frozen=True)
class Difference:
    metric: str
    a: float | None
    b: float | None
    diff: float | None        # b - a
    ci95: tuple[float, float] | None
    n_tasks: int
    paired: bool
    p_value: float | None = None  # McNemar's exact test (success on one rollout per task), else None

    def as_dict(self) -> dict:
        return {"metric": self.metric, "a": self.a, "b": self.b, "diff": self.diff,
                "ci95": list(self.ci95) if self.ci95 else None, "n_tasks": self.n_tasks, "paired": self.paired,
                "p_value": self.p_value}


def _percentile(xs: list[float], q: float) -> float:
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _strata(keys: Sequence[str], stratum: Callable[[str], str] | None) -> list[list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        groups[stratum(k) if stratum else ""].append(i)
    return [groups[s] for s in sorted(groups)]


def bootstrap(a: Mapping[str, TaskAgg], b: Mapping[str, TaskAgg], metric: Metric, *, n_boot: int = 2000,
              seed: int = 0, stratum: Callable[[str], str] | None = None) -> tuple[float | None, float | None,
                                                                               tuple[float, float] | None, bool]:
    """(value under A, value under B, 95% percentile interval of B - A, paired?) resampling tasks."""
    common = sorted(set(a) & set(b))
    paired = bool(common)
    keys_a, keys_b = (common, common) if paired else (sorted(a), sorted(b))
    va, vb = metric([a[k] for k in keys_a]), metric([b[k] for k in keys_b])
    if va is None or vb is None:
        return va, vb, None, paired
    rng = random.Random(seed)
    strata_a, strata_b = _strata(keys_a, stratum), _strata(keys_b, stratum)
    diffs = []
    for _ in range(n_boot):
        ia = [g[rng.randrange(len(g))] for g in strata_a for _ in g]
        ib = ia if paired else [g[rng.randrange(len(g))] for g in strata_b for _ in g]
        x, y = metric([a[keys_a[i]] for i in ia]), metric([b[keys_b[i]] for i in ib])
        if x is not None and y is not None:
            diffs.append(y - x)
    if len(diffs) < n_boot // 2:   # the metric is undefined in most resamples (too few tasks where it applies)
        return va, vb, None, paired
    diffs.sort()
    return va, vb, (_percentile(diffs, 0.025), _percentile(diffs, 0.975)), paired


def mcnemar_exact(wins_b: int, wins_a: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (binomial(n, 1/2) on the smaller side)."""
    n = wins_a + wins_b
    if n == 0:
        return 1.0
    k = min(wins_a, wins_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def compare_tasks(a: Mapping[str, TaskAgg], b: Mapping[str, TaskAgg], *, ks: Sequence[int] = (2, 4),
                  n_boot: int = 2000, seed: int = 0, stratum: Callable[[str], str] | None = None) -> list[Difference]:
    """Every rubric of A and B over their task aggregates (keyed by task id), B - A with its interval."""
    both = list(a.values()) + list(b.values())
    most = max((x.n for x in both), default=0)
    table = metrics({t for x in both for t in x.tools}, {x.family for x in both}, {x.difficulty for x in both},
                    [k for k in ks if k <= most])   # pass@k only where some task has k rollouts
    common = set(a) & set(b)
    out = []
    for name, fn in table.items():
        va, vb, ci, paired = bootstrap(a, b, fn, n_boot=n_boot, seed=seed, stratum=stratum)
        p = None
        if name == "success_rate" and paired and all(a[k].n == 1 and b[k].n == 1 for k in common):
            p = mcnemar_exact(sum(b[k].passed > a[k].passed for k in common),
                              sum(a[k].passed > b[k].passed for k in common))
        out.append(Difference(name, va, vb, None if va is None or vb is None else vb - va, ci,
                              len(common) if paired else len(a) + len(b), paired, p))
    return out


def aggregate(facts: Iterable, task_meta: Mapping[str, dict], key: Callable[[object], str] | None = None
              ) -> dict[str, TaskAgg]:
    """Task id (or ``key(facts)``) -> the aggregate of these rollouts' facts."""
    out: dict[str, TaskAgg] = {}
    for f in facts:
        tid = key(f) if key else (f.info.task_id or "(none)")
        if tid not in out:
            meta = (task_meta.get(f.info.task_id) or {}).get("metadata") or {}
            own = meta.get("metadata") if isinstance(meta.get("metadata"), dict) else {}   # task.toml's [metadata]
            out[tid] = TaskAgg(family=str(own.get("family") or meta.get("family") or f.domain),
                               difficulty=str(own.get("difficulty", meta.get("difficulty", "(none)"))))
        out[tid].add(f)
    return out


def version_tasks(store, version: str, *, purpose: str | None = "eval", config=None,
                  reward_sources: Sequence[str] | None = None, run_ids: Sequence[str] | None = None
                  ) -> dict[str, TaskAgg]:
    """Task id -> aggregate of ``version``'s finished rollouts of this ``purpose`` (None: any; the rollout
    metadata's, absent = train), optionally only from ``run_ids``."""
    from forge_store import RolloutFilter

    from ._analysis_config import RubricConfig
    from ._rollout_facts import collector_paused, iter_facts

    config = config or RubricConfig()
    tasks = {t["id"]: t for t in store.lineage("tasks")}
    runs = set(run_ids) if run_ids is not None else None

    def wanted(f) -> bool:
        own = (f.info.metadata or {}).get("purpose") or "train"
        return (purpose is None or own == purpose) and (runs is None or f.info.run_id in runs)

    with collector_paused():
        facts = iter_facts(store, config=config, flt=RolloutFilter(policy_version_id=version, finished=True),
                           sources=tuple(reward_sources) if reward_sources else None, workers=1)
        return aggregate((f for f in facts if wanted(f)), tasks)


def compare_versions(store, version_a: str, version_b: str, *, purpose: str | None = "eval",
                     ks: Sequence[int] = (2, 4),
                     n_boot: int = 2000, seed: int = 0, reward_sources: Sequence[str] | None = None,
                     run_ids: Sequence[str] | None = None) -> list[Difference]:
    """:func:`compare_tasks` of two versions' rollouts of ``purpose`` (evaluation by default), paired by task;
    ``run_ids``: only rollouts of these runs."""
    a = version_tasks(store, version_a, purpose=purpose, reward_sources=reward_sources, run_ids=run_ids)
    b = version_tasks(store, version_b, purpose=purpose, reward_sources=reward_sources, run_ids=run_ids)
    return compare_tasks(a, b, ks=ks, n_boot=n_boot, seed=seed)
