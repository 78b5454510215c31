"""How spread a version's sampling distribution is, read from the store: the mean surprisal of its own sampled tokens.

A sampled evaluation (``openforge demo --eval-samples K``) records every completion token with the engine's logprob
of it. Over tokens the policy sampled itself at temperature 1, the mean of -logprob is an unbiased estimate of the
policy's per-token entropy there (nats): it rises when a version spreads its probability and falls when it sharpens.
(At another temperature it estimates the entropy of the tempered distribution, if the engine returned
post-temperature logprobs.) No model is loaded: the figures come from what the proxy recorded.

For each role of a kept learning-curve seed (``bench/learning_curve.py --keep DIR``, which keeps the store), prints the
mean surprisal per token (all tokens pooled), the per-task mean (tokens pooled per task, then averaged over tasks)
and the tokens read; then the difference of every other role to ``sft``, paired by task with a 95% bootstrap interval.
The last line is one JSON object.

Usage: python bench/sampled_entropy.py SEED_DIR [--n-boot 4000]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_task(store, run_id: str) -> tuple[dict[str, tuple[float, int]], int]:
    """Task -> (summed surprisal, tokens) over the run's rollouts; and the calls without logprobs (left out)."""
    from forge_store import RolloutFilter

    infos = list(store.iter_rollouts(RolloutFilter(run_id=run_id)))
    out: dict[str, tuple[float, int]] = {}
    missing = 0
    calls = store.calls_by_rollout([r.id for r in infos])
    for info in infos:
        for call in calls.get(info.id, []):
            if not call.completion_logprobs:
                missing += 1
                continue
            s, n = out.get(info.task_id, (0.0, 0))
            out[info.task_id] = (s - sum(call.completion_logprobs), n + len(call.completion_logprobs))
    return out, missing


def paired(a: dict, b: dict, n_boot: int) -> tuple[float, list[float]]:
    """Mean over common tasks of (B's per-task surprisal - A's), with the loop's paired bootstrap over tasks
    (``learner._compare.bootstrap``, what ``compare_tasks`` uses)."""
    from learner._compare import bootstrap

    if not set(a) & set(b):
        raise SystemExit("no task has sampled tokens under both versions")
    va, vb, ci, _ = bootstrap(a, b, _task_mean, n_boot=n_boot)
    return vb - va, list(ci)


def _task_mean(tasks: list[tuple[float, int]]) -> float:
    """Per-task surprisal per token, averaged over tasks (``per_task`` holds only tasks with tokens)."""
    return sum(s / n for s, n in tasks) / len(tasks)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("home", type=Path, help="a seed folder bench/learning_curve.py --keep DIR wrote (DIR/seedN)")
    ap.add_argument("--n-boot", type=int, default=4000)
    args = ap.parse_args(argv)
    from forge_store import Settings, open_store

    result, store_path = args.home / "demo-result.json", args.home / "store.sqlite"
    if not result.exists() or not store_path.exists():
        raise SystemExit(f"{args.home}: needs demo-result.json and store.sqlite (a seed kept by bench/learning_curve.py "
                         "--keep DIR; bench/results/ keeps no stores)")
    doc = json.loads(result.read_text())
    runs = (doc.get("sampled") or {}).get("runs")
    if not runs:
        raise SystemExit(f"{args.home}: this seed ran no sampled evaluation (openforge demo --eval-samples K)")
    tasks: dict[str, dict] = {}
    rows = {}
    with open_store(f"sqlite:///{store_path}", settings=Settings(home=args.home)) as store:
        for role, version in doc["roles"].items():
            if version not in runs:
                continue
            tasks[role], missing = per_task(store, runs[version])
            t = tasks[role]
            tokens = sum(n for _, n in t.values())
            rows[role] = {"version": version, "tokens": tokens, "calls_without_logprobs": missing,
                          "surprisal_per_token": sum(s for s, _ in t.values()) / tokens if tokens else None,
                          "surprisal_task_mean": _task_mean(list(t.values())) if t else None}
    print(f"{'role':<14} {'version':<34} {'tokens':>8} {'nats/token':>11} {'task mean':>10}")
    for role, r in rows.items():
        if not r["tokens"]:
            print(f"{role:<14} {r['version']:<34} {0:>8} {'-':>11} {'-':>10}  (no logprobs recorded)")
            continue
        print(f"{role:<14} {r['version']:<34} {r['tokens']:>8} {r['surprisal_per_token']:>11.4f} "
              f"{r['surprisal_task_mean']:>10.4f}")
    if tasks.get("sft"):
        for role in [r for r in tasks if r != "sft" and tasks[r]]:
            d, ci = paired(tasks["sft"], tasks[role], args.n_boot)
            rows[role]["minus_sft"], rows[role]["minus_sft_ci95"] = d, ci
            print(f"{role} - sft, paired by task: {d:+.4f} nats/token [{ci[0]:+.4f}, {ci[1]:+.4f}]")
    print(json.dumps({"home": str(args.home), "roles": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
