"""Store-wide behaviour analysis: rubrics of every rollout, aggregated per policy version, harness or domain.

Rates are pooled over the slice (failed tool calls recovered / failed tool calls, not a mean of per-rollout rates);
coverage and efficiency are means over the rollouts where they apply. pass@k / pass^k are computed per task within
the slice and averaged over the tasks that have at least k graded rollouts. Latency is wall-clock
``ended_at - started_at`` of finished rollouts. Rates of timeouts and infra errors are over finished rollouts;
the exclusion rate is the share of finished rollouts with at least one exclusion row (any export), and
``exclusions`` counts distinct excluded rollouts per reason.

A rollout's reward is the one that counts by the store's rule (``Store.latest_rewards``: its latest from the chosen
``reward_sources``, every source by default); it passes when that reward reaches ``pass_threshold`` or, without
one, when its outcome is ``success``. This reads every trajectory (light batched reads, ``Store.call_summaries``):
right for reports and notebooks. The dashboards aggregate in SQL instead (``Store.stats``) and compute rubrics with
:func:`rubric_summary` on a sample.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from forge_store import REWARD_SOURCES, RolloutFilter, RolloutInfo, Store

from ._analysis_config import CATEGORIES, RubricConfig
from ._rollout_facts import RolloutFacts, collector_paused, iter_facts, rollout_facts
from ._stats import pass_at_k, pass_hat_k, percentile

SLICES = ("policy_version", "harness", "domain")


class AnalysisError(ValueError):
    """An analysis request that cannot be answered as asked."""


def _check_sources(reward_sources: Sequence[str] | None) -> tuple[str, ...] | None:
    if reward_sources is None:
        return None
    for s in reward_sources:
        if s not in REWARD_SOURCES:
            raise AnalysisError(f"--reward-source {s!r}: a reward source is one of {', '.join(REWARD_SOURCES)}; "
                                "pass one of those, or leave the option out for every source")
    return tuple(reward_sources)


def collect(store: Store, *, config: RubricConfig | None = None, since: datetime | None = None,
            flt: RolloutFilter | None = None, limit: int | None = None, reward_sources: Sequence[str] | None = None,
            progress: Callable[[int], None] | None = None, batch_size: int = 200,
            workers: int | None = None) -> list[RolloutFacts]:
    """Facts and rubrics of every finished rollout (started at or after ``since``), in ingest order; calls and
    rewards are read in batches of ``batch_size`` rollouts (``workers``: see :func:`iter_facts`)."""
    sources = _check_sources(reward_sources)
    with collector_paused():
        return list(iter_facts(store, config=config or RubricConfig(), since=since, flt=flt, limit=limit,
                               sources=sources, progress=progress, batch_size=batch_size, workers=workers))


@dataclass
class _Slice:
    """What every table needs of one slice's rollouts, added one at a time (in ingest order, so that the means
    sum their values in the order a list of the slice's facts would): memory per slice, not per rollout's calls."""

    rollouts: int = 0
    outcomes: Counter = field(default_factory=Counter)
    graded: int = 0
    graded_passed: int = 0
    tasks: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0]))  # task -> [graded, passed]
    latencies: list = field(default_factory=list)
    excluded: int = 0
    reasons: Counter = field(default_factory=Counter)
    tool_calls: int = 0
    shell: int = 0
    format_ok: int = 0
    failed: int = 0
    recovered: int = 0
    wrote: int = 0
    verified: int = 0
    tooled: int = 0            # rollouts with a tool call
    inspected_first: int = 0   # of them, those whose first tool call only looks
    names: int = 0             # file names in tool calls
    made_up: int = 0           # of them, names nothing shown before held
    coverage: list = field(default_factory=list)
    efficiency: list = field(default_factory=list)  # of rollouts that passed
    tools: Counter = field(default_factory=Counter)
    categories: Counter = field(default_factory=Counter)

    def add(self, f: RolloutFacts, config: RubricConfig, excluded: dict[str, set[str]]) -> None:
        r = f.rubrics
        self.rollouts += 1
        self.outcomes[f.info.outcome] += 1
        if f.info.outcome in config.graded_outcomes:
            self.graded += 1
            self.graded_passed += int(f.passed)
            task = self.tasks[f.info.task_id or "(none)"]
            task[0] += 1
            task[1] += int(f.passed)
        self.latencies.append(f.latency_s)
        if f.info.id in excluded:
            self.excluded += 1
            self.reasons.update(excluded[f.info.id])
        self.tool_calls += r.n_tool_calls
        self.shell += r.category_counts.get("shell", 0)
        self.format_ok += r.format_ok
        self.failed += r.failed
        self.recovered += r.recovered
        if r.wrote:
            self.wrote += 1
            self.verified += bool(r.self_verified)
        if r.inspected_first is not None:
            self.tooled += 1
            self.inspected_first += r.inspected_first
        self.names += r.names
        self.made_up += r.made_up
        self.coverage.append(r.coverage)
        if f.passed:
            self.efficiency.append(r.efficiency)
        self.tools.update(r.tool_counts)
        self.categories.update(r.category_counts)


def _slices(facts: Iterable[RolloutFacts], by: str, excluded: dict[str, set[str]] | None = None,
            config: RubricConfig | None = None) -> dict[str, _Slice]:
    """Slice key -> its aggregates, keys sorted; one pass over ``facts`` (a list or a stream)."""
    if by not in SLICES:
        raise AnalysisError(f"--by {by!r}: slice by one of {', '.join(SLICES)}")
    config, excluded = config or RubricConfig(), excluded or {}
    out: dict[str, _Slice] = {}
    for f in facts:
        key = f.key(by)
        if key not in out:
            out[key] = _Slice()
        out[key].add(f, config, excluded)
    return dict(sorted(out.items()))


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _mean(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def _pass_rates(tasks: dict[str, list[int]], k: int) -> dict[str, dict]:
    return {t: {"n": n, "c": c, "pass@k": pass_at_k(n, c, k), "pass^k": pass_hat_k(n, c, k)}
            for t, (n, c) in sorted(tasks.items())}


def task_pass_rates(facts: Sequence[RolloutFacts], k: int, config: RubricConfig | None = None) -> dict[str, dict]:
    """Per task: n graded, c passed, pass@k and pass^k (None when n < k)."""
    return _pass_rates(_all(facts, config).tasks, k)


def _all(facts: Iterable[RolloutFacts], config: RubricConfig | None = None,
         excluded: dict[str, set[str]] | None = None) -> _Slice:
    one = _Slice()
    for f in facts:
        one.add(f, config or RubricConfig(), excluded or {})
    return one


def _summary_row(s: _Slice, ks: Sequence[int]) -> dict:
    row = {"rollouts": s.rollouts, "success_rate": _ratio(s.graded_passed, s.graded)}
    for k in ks:
        per_task = _pass_rates(s.tasks, k).values()
        row[f"pass@{k}"] = _mean(t["pass@k"] for t in per_task)
        row[f"pass^{k}"] = _mean(t["pass^k"] for t in per_task)
    row.update({"latency_p50_s": percentile(s.latencies, 50), "latency_p95_s": percentile(s.latencies, 95),
                "timeout_rate": s.outcomes["policy_timeout"] / s.rollouts,
                "infra_error_rate": s.outcomes["infra_error"] / s.rollouts,
                "exclusion_rate": s.excluded / s.rollouts})
    return row


def _behaviour(s: _Slice) -> dict:
    return {
        "rollouts": s.rollouts, "tool_calls": s.tool_calls, "tool_calls_per_rollout": _ratio(s.tool_calls, s.rollouts),
        "shell_share": _ratio(s.shell, s.tool_calls), "format_ok_rate": _ratio(s.format_ok, s.tool_calls),
        "failed_tool_calls": s.failed, "recovery_rate": _ratio(s.recovered, s.failed),
        "self_verification_rate": _ratio(s.verified, s.wrote),
        "inspect_first_rate": _ratio(s.inspected_first, s.tooled), "made_up_name_rate": _ratio(s.made_up, s.names),
        "tool_coverage": _mean(s.coverage),
        # over rollouts that passed: a rollout that gives up after one call is not "efficient"
        "step_efficiency": _mean(s.efficiency),
    }


def _tool_rows(slices: dict[str, _Slice], by: str) -> list[dict]:
    config, rows = RubricConfig(), []
    for key, s in slices.items():
        total = sum(s.tools.values())
        rows += [{by: key, "tool": name, "category": config.category(name), "calls": n, "share": n / total}
                 for name, n in s.tools.most_common()]
    return rows


def _category_rows(slices: dict[str, _Slice], by: str) -> list[dict]:
    rows = []
    for key, s in slices.items():
        total = sum(s.categories.values())
        rows.append({by: key, **{c: _ratio(s.categories[c], total) for c in CATEGORIES}})
    return rows


def _exclusion_rows(slices: dict[str, _Slice], by: str) -> list[dict]:
    return [{by: key, "reason": r, "rollouts": n, "rate": n / s.rollouts}
            for key, s in slices.items() for r, n in sorted(s.reasons.items())]


def summary_rows(facts: Sequence[RolloutFacts], by: str, *, ks: Sequence[int] = (1, 5),
                 excluded: dict[str, set[str]] | None = None, config: RubricConfig | None = None) -> list[dict]:
    """Outcome, pass@k / pass^k, latency and error / exclusion rates per slice."""
    return [{by: key, **_summary_row(s, ks)} for key, s in _slices(facts, by, excluded, config).items()]


def behaviour(facts: Sequence[RolloutFacts]) -> dict:
    """Tool-use rubrics over these rollouts, pooled (rates over all their tool calls; means for coverage and
    efficiency): one row of the behaviour table without its slice."""
    return _behaviour(_all(facts))


def behaviour_rows(facts: Sequence[RolloutFacts], by: str) -> list[dict]:
    """Tool-use rubrics per slice (:func:`behaviour` of each)."""
    return [{by: key, **_behaviour(s)} for key, s in _slices(facts, by).items()]


def rubric_summary(store: Store, rollouts: Sequence[RolloutInfo], *, config: RubricConfig | None = None,
                   reward_sources: Sequence[str] | None = None) -> dict:
    """The behaviour rubrics of ``openforge analyze`` over these rollouts (a dashboard's sample), by the same code:
    :func:`behaviour` of their facts."""
    return behaviour(rollout_facts(store, rollouts, config=config or RubricConfig(),
                                   sources=_check_sources(reward_sources)))


def tool_rows(facts: Sequence[RolloutFacts], by: str) -> list[dict]:
    """One row per slice and tool: its category, count and share of the slice's tool calls."""
    return _tool_rows(_slices(facts, by), by)


def category_rows(facts: Sequence[RolloutFacts], by: str) -> list[dict]:
    """Per slice, the share of tool calls in each category (shell, read, write, search, service)."""
    return _category_rows(_slices(facts, by), by)


def exclusion_rows(facts: Sequence[RolloutFacts], by: str, excluded: dict[str, set[str]]) -> list[dict]:
    """Distinct excluded rollouts per slice and reason."""
    return _exclusion_rows(_slices(facts, by, excluded), by)


def analyze(store: Store, *, by: str = "policy_version", ks: Sequence[int] = (1, 5),
            config: RubricConfig | None = None, since: datetime | None = None,
            reward_sources: Sequence[str] | None = None, progress: Callable[[int], None] | None = None,
            workers: int | None = None) -> dict[str, list[dict]]:
    """Every table of ``openforge analyze``: summary, behaviour, categories, tools, exclusions. Only rewards from
    ``reward_sources`` count (None: every source). One streaming pass (:func:`iter_facts`; ``workers`` as there):
    memory holds a few batches of rollouts' calls and the per-slice aggregates, not the facts of every rollout."""
    if by not in SLICES:
        raise AnalysisError(f"--by {by!r}: slice by one of {', '.join(SLICES)}")
    if any(k < 1 for k in ks):
        raise AnalysisError(f"--k {list(ks)}: k must be 1 or more; pass e.g. --k 1 --k 5")
    config, sources = config or RubricConfig(), _check_sources(reward_sources)
    excluded = store.exclusion_reasons()
    with collector_paused():
        slices = _slices(iter_facts(store, config=config, since=since, sources=sources, progress=progress,
                                    workers=workers), by, excluded, config)
    return {"summary": [{by: key, **_summary_row(s, ks)} for key, s in slices.items()],
            "behaviour": [{by: key, **_behaviour(s)} for key, s in slices.items()],
            "categories": _category_rows(slices, by), "tools": _tool_rows(slices, by),
            "exclusions": _exclusion_rows(slices, by)}
