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
from dataclasses import dataclass
from datetime import datetime

from forge_store import REWARD_SOURCES, RolloutFilter, RolloutInfo, Store

from ._analysis_config import CATEGORIES, RubricConfig
from ._rubrics import RolloutRubrics, pass_at_k, pass_hat_k, percentile, rollout_rubrics

SLICES = ("policy_version", "harness", "domain")


class AnalysisError(ValueError):
    """An analysis request that cannot be answered as asked."""


@dataclass(frozen=True)
class RolloutFacts:
    """What the analysis needs of one rollout."""

    info: RolloutInfo
    harness: str
    domain: str
    reward: float | None
    passed: bool
    latency_s: float | None
    rubrics: RolloutRubrics

    def key(self, by: str) -> str:
        if by == "policy_version":
            return self.info.policy_version_id or "(none)"
        return self.harness if by == "harness" else self.domain


def _passed(outcome: str | None, reward: float | None, config: RubricConfig) -> bool:
    return reward >= config.pass_threshold if reward is not None else outcome == "success"


def _check_sources(reward_sources: Sequence[str] | None) -> tuple[str, ...] | None:
    if reward_sources is None:
        return None
    for s in reward_sources:
        if s not in REWARD_SOURCES:
            raise AnalysisError(f"--reward-source {s!r}: a reward source is one of {', '.join(REWARD_SOURCES)}; "
                                "pass one of those, or leave the option out for every source")
    return tuple(reward_sources)


class _Lineage:
    """What the facts of any rollout need from the small lineage tables, read once."""

    def __init__(self, store: Store):
        self.tasks = {t["id"]: t for t in store.lineage("tasks")}
        self.harnesses = {h["id"]: h for h in store.lineage("harnesses")}


def collect(store: Store, *, config: RubricConfig | None = None, since: datetime | None = None,
            flt: RolloutFilter | None = None, limit: int | None = None, reward_sources: Sequence[str] | None = None,
            progress: Callable[[int], None] | None = None, batch_size: int = 200) -> list[RolloutFacts]:
    """Facts and rubrics of every finished rollout (started at or after ``since``), in ingest order.

    Calls and rewards are read in batches of ``batch_size`` rollouts."""
    config = config or RubricConfig()
    sources = _check_sources(reward_sources)
    lineage = _Lineage(store)
    out: list[RolloutFacts] = []
    batch: list[RolloutInfo] = []
    for info in store.iter_rollouts(flt or RolloutFilter(finished=True)):
        if info.status != "finished" or (since is not None and info.started_at < since):
            continue
        batch.append(info)
        if len(batch) == batch_size or (limit is not None and len(out) + len(batch) >= limit):
            out += rollout_facts(store, batch, config=config, reward_sources=sources, lineage=lineage)
            batch = []
            if progress:
                progress(len(out))
            if limit is not None and len(out) >= limit:
                return out
    out += rollout_facts(store, batch, config=config, reward_sources=sources, lineage=lineage)
    return out


def rollout_facts(store: Store, infos: Sequence[RolloutInfo], *, config: RubricConfig | None = None,
                  reward_sources: Sequence[str] | None = None, lineage: _Lineage | None = None) -> list[RolloutFacts]:
    """Facts and rubrics of these rollouts (one batched read of their calls and one of their rewards)."""
    if not infos:
        return []
    config = config or RubricConfig()
    lineage = lineage or _Lineage(store)
    ids = [i.id for i in infos]
    calls_of = store.call_summaries(ids)
    rewards = store.latest_rewards(ids, sources=reward_sources)
    out = []
    for info in infos:
        task = lineage.tasks.get(info.task_id) or {}
        h = lineage.harnesses.get(info.harness_id)
        harness = f"{h['name']}@{h['version']}" if h and h.get("version") else (h["name"] if h else (info.harness_id or "(none)"))
        value = rewards[info.id].value if info.id in rewards else None
        calls = calls_of.get(info.id, [])
        latency = (info.ended_at - info.started_at).total_seconds() if info.ended_at else None
        out.append(RolloutFacts(info=info, harness=harness, domain=task.get("domain") or "(none)", reward=value,
                                passed=_passed(info.outcome, value, config), latency_s=latency,
                                rubrics=rollout_rubrics(calls, task_metadata=task.get("metadata"), config=config,
                                                        rollout_id=info.id)))
    return out


def _groups(facts: Iterable[RolloutFacts], by: str) -> dict[str, list[RolloutFacts]]:
    if by not in SLICES:
        raise AnalysisError(f"--by {by!r}: slice by one of {', '.join(SLICES)}")
    out: dict[str, list[RolloutFacts]] = defaultdict(list)
    for f in facts:
        out[f.key(by)].append(f)
    return dict(sorted(out.items()))


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _mean(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def task_pass_rates(facts: Sequence[RolloutFacts], k: int, config: RubricConfig | None = None) -> dict[str, dict]:
    """Per task: n graded, c passed, pass@k and pass^k (None when n < k)."""
    config = config or RubricConfig()
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for f in facts:
        if f.info.outcome in config.graded_outcomes:
            counts[f.info.task_id or "(none)"][0] += 1
            counts[f.info.task_id or "(none)"][1] += int(f.passed)
    return {t: {"n": n, "c": c, "pass@k": pass_at_k(n, c, k), "pass^k": pass_hat_k(n, c, k)}
            for t, (n, c) in sorted(counts.items())}


def summary_rows(facts: Sequence[RolloutFacts], by: str, *, ks: Sequence[int] = (1, 5),
                 excluded: dict[str, set[str]] | None = None, config: RubricConfig | None = None) -> list[dict]:
    """Outcome, pass@k / pass^k, latency and error / exclusion rates per slice."""
    config = config or RubricConfig()
    excluded = excluded or {}
    rows = []
    for key, fs in _groups(facts, by).items():
        outcomes = Counter(f.info.outcome for f in fs)
        graded = [f for f in fs if f.info.outcome in config.graded_outcomes]
        row = {by: key, "rollouts": len(fs), "success_rate": _ratio(sum(f.passed for f in graded), len(graded))}
        for k in ks:
            per_task = task_pass_rates(fs, k, config).values()
            row[f"pass@{k}"] = _mean(t["pass@k"] for t in per_task)
            row[f"pass^{k}"] = _mean(t["pass^k"] for t in per_task)
        lat = [f.latency_s for f in fs]
        row.update({"latency_p50_s": percentile(lat, 50), "latency_p95_s": percentile(lat, 95),
                    "timeout_rate": outcomes["policy_timeout"] / len(fs),
                    "infra_error_rate": outcomes["infra_error"] / len(fs),
                    "exclusion_rate": sum(1 for f in fs if f.info.id in excluded) / len(fs)})
        rows.append(row)
    return rows


def behaviour(facts: Sequence[RolloutFacts]) -> dict:
    """Tool-use rubrics over these rollouts, pooled (rates over all their tool calls; means for coverage and
    efficiency): one row of the behaviour table without its slice."""
    rs = [f.rubrics for f in facts]
    tool_calls = sum(r.n_tool_calls for r in rs)
    wrote = [r for r in rs if r.wrote]
    return {
        "rollouts": len(rs), "tool_calls": tool_calls, "tool_calls_per_rollout": _ratio(tool_calls, len(rs)),
        "shell_share": _ratio(sum(r.category_counts.get("shell", 0) for r in rs), tool_calls),
        "format_ok_rate": _ratio(sum(r.format_ok for r in rs), tool_calls),
        "failed_tool_calls": sum(r.failed for r in rs),
        "recovery_rate": _ratio(sum(r.recovered for r in rs), sum(r.failed for r in rs)),
        "self_verification_rate": _ratio(sum(bool(r.self_verified) for r in wrote), len(wrote)),
        "tool_coverage": _mean(r.coverage for r in rs),
        # over rollouts that passed: a rollout that gives up after one call is not "efficient"
        "step_efficiency": _mean(f.rubrics.efficiency for f in facts if f.passed),
    }


def behaviour_rows(facts: Sequence[RolloutFacts], by: str) -> list[dict]:
    """Tool-use rubrics per slice (:func:`behaviour` of each)."""
    return [{by: key, **behaviour(fs)} for key, fs in _groups(facts, by).items()]


def rubric_summary(store: Store, rollouts: Sequence[RolloutInfo], *, config: RubricConfig | None = None,
                   reward_sources: Sequence[str] | None = None) -> dict:
    """The behaviour rubrics of ``openforge analyze`` over these rollouts (a dashboard's sample), by the same code:
    :func:`behaviour` of their facts."""
    return behaviour(rollout_facts(store, rollouts, config=config, reward_sources=_check_sources(reward_sources)))


def tool_rows(facts: Sequence[RolloutFacts], by: str) -> list[dict]:
    """One row per slice and tool: its category, count and share of the slice's tool calls."""
    rows = []
    config = RubricConfig()
    for key, fs in _groups(facts, by).items():
        counts: Counter = Counter()
        cats: dict[str, str] = {}
        for f in fs:
            counts.update(f.rubrics.tool_counts)
        total = sum(counts.values())
        for name, n in counts.most_common():
            cats[name] = config.category(name)
            rows.append({by: key, "tool": name, "category": cats[name], "calls": n, "share": n / total})
    return rows


def category_rows(facts: Sequence[RolloutFacts], by: str) -> list[dict]:
    """Per slice, the share of tool calls in each category (shell, read, write, search, service)."""
    rows = []
    for key, fs in _groups(facts, by).items():
        counts: Counter = Counter()
        for f in fs:
            counts.update(f.rubrics.category_counts)
        total = sum(counts.values())
        rows.append({by: key, **{c: _ratio(counts[c], total) for c in CATEGORIES}})
    return rows


def exclusion_rows(facts: Sequence[RolloutFacts], by: str, excluded: dict[str, set[str]]) -> list[dict]:
    """Distinct excluded rollouts per slice and reason."""
    rows = []
    for key, fs in _groups(facts, by).items():
        reasons = Counter(r for f in fs for r in excluded.get(f.info.id, ()))
        rows += [{by: key, "reason": r, "rollouts": n, "rate": n / len(fs)} for r, n in sorted(reasons.items())]
    return rows


def analyze(store: Store, *, by: str = "policy_version", ks: Sequence[int] = (1, 5),
            config: RubricConfig | None = None, since: datetime | None = None,
            reward_sources: Sequence[str] | None = None,
            progress: Callable[[int], None] | None = None) -> dict[str, list[dict]]:
    """Every table of ``openforge analyze``: summary, behaviour, categories, tools, exclusions. Only rewards from
    ``reward_sources`` count (None: every source)."""
    if by not in SLICES:
        raise AnalysisError(f"--by {by!r}: slice by one of {', '.join(SLICES)}")
    if any(k < 1 for k in ks):
        raise AnalysisError(f"--k {list(ks)}: k must be 1 or more; pass e.g. --k 1 --k 5")
    config = config or RubricConfig()
    facts = collect(store, config=config, since=since, reward_sources=reward_sources, progress=progress)
    excluded = store.exclusion_reasons()
    return {"summary": summary_rows(facts, by, ks=ks, excluded=excluded, config=config),
            "behaviour": behaviour_rows(facts, by), "categories": category_rows(facts, by),
            "tools": tool_rows(facts, by), "exclusions": exclusion_rows(facts, by, excluded)}
