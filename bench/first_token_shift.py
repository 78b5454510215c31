"""How two policy versions differ on a turn's first decision: stop (a text answer) or open a tool call.

Reads the re-scores two versions left in a store (``openforge rescore --version A`` and ``--version B`` with the same
scorer, e.g. through ``bench/rescore.py``) and, for every call both re-scored, sorts its answer by its first tokens
into ``text`` (the turn ends) or ``tool`` (a ``<tool_call>`` opens) and takes the change of the summed logprob of
its first ``--tokens`` completion tokens, B minus A (teacher-forced on the stored tokens). Prints, per kind, the mean
change with a 95% bootstrap interval over calls (which understates the spread: the calls of one rollout share their
context) and the share that rose; the last line is one JSON object.

    python bench/first_token_shift.py --store URL --versions A B [--scorer hf-float32] [--tokens 3]
                                      [--tokenizer tokenizer.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--versions", nargs=2, required=True, metavar=("A", "B"))
    ap.add_argument("--scorer", default="hf-float32")
    ap.add_argument("--tokens", type=int, default=3, help="first completion tokens summed (default 3)")
    ap.add_argument("--tokenizer", type=Path, help="tokenizer.json (default: version A's checkpoint's)")
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    from bench.shard_pushes import answer_kind
    from forge_store import Settings, open_store, rescores
    from learner._rescore import select

    with open_store(args.store, settings=Settings()) as st:
        a, b = ({r.call_id: r.logprobs for r in rescores(st, policy_version_id=v, scorer=args.scorer)}
                for v in args.versions)
        both = [c for c in a if c in b]
        if not both:
            ap.error(f"no call of {args.store} is re-scored under both {args.versions[0]} and {args.versions[1]} by "
                     f"{args.scorer}: run openforge rescore --version V --scorer {args.scorer} for each first")
        found = args.tokenizer
        if found is None:
            row = next((r for r in st.lineage("policy_versions") if r["id"] == args.versions[0]), {})
            ckpt = row.get("checkpoint_id")
            found = Path(ckpt) / "tokenizer.json" if ckpt else None
        if found is None or not found.is_file():
            ap.error(f"no tokenizer.json at {found}: pass --tokenizer PATH")
        wanted = set(both)
        calls = {c.id: c for cs in st.token_calls(select(st).rollout_ids).values() for c in cs if c.id in wanted}
    tok = Tokenizer.from_file(str(found))
    shift: dict[str, list[float]] = {"text": [], "tool": []}
    for cid in both:
        kind = answer_kind(tok, calls[cid].completion_token_ids)
        shift[kind].append(sum(b[cid][:args.tokens]) - sum(a[cid][:args.tokens]))
    out = {"versions": args.versions, "scorer": args.scorer, "tokens": args.tokens}
    rng = random.Random(0)
    for kind, v in shift.items():
        if not v:
            continue
        boots = sorted(statistics.fmean(rng.choices(v, k=len(v))) for _ in range(2000))
        row = {"answers": len(v), "mean": round(statistics.fmean(v), 4),
               "ci95": [round(boots[49], 4), round(boots[1949], 4)], "rose": round(sum(x > 0 for x in v) / len(v), 3)}
        out[kind] = row
        print(f"{kind:<5} {row['answers']:>5} answers  mean {row['mean']:+.3f} nats  95% [{row['ci95'][0]:+.3f}, "
              f"{row['ci95'][1]:+.3f}]  rose {row['rose']:.0%}", file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
