"""Re-scoring stored rollouts under two policy versions on this machine's CPU (issue 34).

    python bench/rescore.py --store URL --versions SFT FINAL [--where EXPR]   # an existing store (e.g. the demo's)
    python bench/rescore.py [--groups 3 --per-group 2]                       # a small store made here
    python bench/rescore.py --store URL --versions SFT FINAL --scorer vllm-served   # through the CPU vLLM engine

With ``--store``, every selected call is re-scored under both versions (what is stored already is skipped: run it
on a fresh store, or read ``already``). Without it, the bench makes its own store first: two-turn rollouts recorded
through the proxy from the CPU vLLM engine under ``base`` (tests/rescore_rig.py), then one real GRPO step on them
gives the second version; the recording and the step are not timed. The versions are then ``base`` (the behaviour
policy) and the trained one.

Figures: ``self_ratio_mean`` / ``self_kl`` over the calls re-scored under the version that served them (must be
in [0.99, 1.01] / |k3| <= 1e-3: token-exact end to end), ``kl_sft_vs_final`` the k3 KL(behaviour || second
version) over the first version's calls, ``mismatch_p99`` the 99th percentile of |logp_engine - logp_V| over the
self re-scored tokens. ``minutes`` and ``tokens_per_s`` are the two re-scores' wall time (model loads included).
``--scorer vllm-served`` scores through the CPU vLLM engine instead of the Hugging Face model: one server is started
on the first version's checkpoint and switched to the second in place (``VllmServer.load_weights``, as the loop
switches policies); its start and the switch are inside ``minutes``. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forge_store import Settings, open_store  # noqa: E402
from learner import ExportConfig, export, mismatch_pairs, mismatch_tally, rescore, self_consistency, train  # noqa: E402
from proxy.engines import CACHE_ENV, VllmServer, ensure_env, ensure_model  # noqa: E402


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_store(work: Path, python: Path, groups: int, per_group: int) -> tuple[str, list[str]]:
    from tests.rescore_rig import record

    url = f"sqlite:///{work / 'store.sqlite'}"
    t0 = time.monotonic()
    with VllmServer(os.environ.get(CACHE_ENV)) as server:
        facts = record(server.base_url, work, url, ensure_model(os.environ.get(CACHE_ENV), progress=False),
                       groups=groups, per_group=per_group)
    _say(f"recorded {facts['calls']} calls in {facts['rollouts']} rollouts ({time.monotonic() - t0:.0f} s)")
    with open_store(url, settings=Settings(home=work / "home")) as st:
        export(st, work / "shard", ExportConfig(format="verl", keep_truncated=True))
        res = train(st, work / "shard", work / "ckpt", python=python, lr=1e-4, steps=1, policy_id="trained",
                    progress=_say)
    return url, ["base", res.policy_version]


def _served(st, versions: list[str], args) -> list:
    """Both versions through one CPU vLLM server: started on the first version's weights, switched in place."""
    from learner._rescore import _checkpoint, _version

    folders = [_checkpoint(_version(st, v), v, None) for v in versions]
    results = []
    with VllmServer(os.environ.get(CACHE_ENV), progress=False) as server:
        for v, folder in zip(versions, folders):
            _say(f"engine: {v}'s weights loaded in {server.load_weights(folder):.1f} s")
            results.append(rescore(st, v, scorer="vllm-served", engines=[server.base_url],
                                   served_model=server.model_name, concurrency=args.concurrency, where=args.where,
                                   progress=_say))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", help="an existing store (default: a small one made here)")
    ap.add_argument("--versions", nargs=2, metavar=("SFT", "FINAL"), help="two policy versions (with --store)")
    ap.add_argument("--where", help="which rollouts (the export's --where language; default: all)")
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--per-group", type=int, default=2)
    ap.add_argument("--scorer", choices=("hf-float32", "hf-bfloat16", "vllm-served"), default="hf-float32",
                    help="the Hugging Face model of each checkpoint in float32 (default, the engine's dtype) or under "
                    "bfloat16 autocast, or the CPU vLLM engine serving it")
    ap.add_argument("--concurrency", type=int, default=4, help="vllm-served: requests in flight at once")
    ap.add_argument("--workers", type=int, help="hf-*: scoring processes at once (default: one per core)")
    args = ap.parse_args(argv)
    if bool(args.store) != bool(args.versions):
        ap.error("--store and --versions go together: an existing store and the two versions to re-score it under")
    python = ensure_env(os.environ.get(CACHE_ENV), progress=False)
    with tempfile.TemporaryDirectory(prefix="bench-rescore-") as tmp:
        work = Path(tmp)
        url, versions = (args.store, args.versions) if args.store else make_store(work, python, args.groups,
                                                                                   args.per_group)
        with open_store(url, settings=Settings(home=work / "home")) as st:
            t0 = time.monotonic()
            results = (_served(st, versions, args) if args.scorer == "vllm-served" else
                       [rescore(st, v, python=python, scorer=args.scorer, where=args.where, workers=args.workers,
                                progress=_say) for v in versions])
            seconds = time.monotonic() - t0
            pairs = [p for v in versions for p in mismatch_pairs(st, version=v)]
    own = self_consistency(pairs)   # pooled over both versions' self re-scores
    cross = [p for p in pairs if p.version == versions[1] and p.behaviour == versions[0]]
    tokens = sum(r.tokens for r in results)
    out = {"store": "self-made" if not args.store else "existing", "versions": versions, "scorer": args.scorer,
           "workers": results[0].lineage.get("workers"),
           "calls": max(r.selected_calls for r in results), "scored_calls": sum(r.scored_calls for r in results),
           "already": sum(r.already for r in results), "tokens": tokens,
           "tokens_per_s": round(tokens / seconds, 1) if seconds else None, "minutes": round(seconds / 60, 3),
           "self_calls": own["calls"], "self_ratio_mean": own["ratio_mean"], "self_kl": own["kl_k3"],
           "self_ok": own["ok"], "kl_sft_vs_final": mismatch_tally(cross).row()["kl_k3"] if cross else None,
           "mismatch_p99": mismatch_tally([p for p in pairs if p.behaviour == p.version]).row()["mismatch_p99"],
           "worst_self_tokens": own["worst_tokens"][:3]}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
