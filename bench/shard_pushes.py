"""Where a GRPO round's update pushes a turn's first decision: stop (a text answer) or open a tool call.

Reads the veRL shards a loop left (``DIR/shards/grpo-*``: ``openforge demo`` with ``OPENFORGE_HOME=HOME`` writes
them under ``HOME/demo``) and, for every policy span of every sample (one span = one model answer: a run of
``response_mask`` 1s), sorts the answer by its first tokens into ``text`` (the turn ends) or ``tool`` (it opens a
``<tool_call>``), and adds the weight the loss gives that span's first token: ``advantage / policy tokens of the
sample`` as ``seq-mean-token-mean`` (the demo's default aggregation) weighs it, or ``advantage / horizon`` (the
shard's longest response) as ``seq-mean-token-sum-norm`` (Dr. GRPO) does (``--loss-agg``). A positive net sum means
the round's gradient raises that opening where it was sampled, summed over the shard. Every rollout ends with one
text answer, so under ``seq-mean-token-sum-norm`` a complete group's net push on stopping is its advantages' sum,
0; under ``seq-mean-token-mean`` it is sum(advantage / length), which is not 0 when length and reward go together.
``net_*_share`` divides a net push by the sum of every first token's |weight| (Adam cancels the overall scale, so
the share is what compares across aggregations). Also counts how each rollout ended.

    python bench/shard_pushes.py DIR [--tokenizer tokenizer.json] [--loss-agg MODE]

Prints a table per shard; the last line is one JSON object (per shard: ``net_text``, ``net_tool``, their shares,
the counts).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import sys
from pathlib import Path


def spans(mask: list[int]) -> list[list[int]]:
    out, cur = [], []
    for j, m in enumerate(mask):
        if m:
            cur.append(j)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def answer_kind(tok, ids: list[int]) -> str:
    """``tool`` when the answer's first tokens open a ``<tool_call>``, else ``text`` (the turn ends)."""
    return "tool" if tok.decode(list(ids[:4]), skip_special_tokens=False).lstrip().startswith("<tool") else "text"


def _segment(row: dict) -> tuple[str, int]:
    """(rollout, segment index) from a veRL row's key ``{uid}_{session}_{index}``: segments in their order."""
    return row["rollout_id"], int(row["key"].rsplit("_", 1)[1])


AGGREGATIONS = ("seq-mean-token-mean", "seq-mean-token-sum-norm")


def shard_pushes(shard: Path, tok, loss_agg: str = "seq-mean-token-mean") -> dict:
    import pyarrow.parquet as pq

    if loss_agg not in AGGREGATIONS:
        raise ValueError(f"loss aggregation {loss_agg!r}: one of {', '.join(AGGREGATIONS)}")
    rows = [r for f in sorted(shard.glob("trajectories-*.parquet")) for r in pq.read_table(f).to_pylist()]
    horizon = max((len(r["response_ids"]) for r in rows), default=1)
    push, turns, ends = collections.defaultdict(float), collections.Counter(), collections.Counter()
    last: dict[str, tuple[float, str, int]] = {}
    for r in sorted(rows, key=_segment):
        mask, ids, adv = r["response_mask"], r["response_ids"], float(r["advantage"])
        n = sum(mask)
        if not n:
            continue
        sign = "pos" if adv > 0 else "neg" if adv < 0 else "zero"
        kinds = []
        for sp in spans(mask):
            kind = answer_kind(tok, [ids[j] for j in sp])
            cut = "<|im_end|>" not in tok.decode([ids[j] for j in sp[-2:]], skip_special_tokens=False)
            kinds.append(kind + ("-cut" if cut else ""))
            push[(kind, sign)] += adv / (n if loss_agg == "seq-mean-token-mean" else horizon)
            turns[(kind, sign)] += 1
        prev = last.get(r["rollout_id"], (0.0, "", 0))
        last[r["rollout_id"]] = (float(r["reward_score"]), kinds[-1], prev[2] + len(kinds))
    for reward, kind, k in last.values():
        ends[("success" if reward >= 1 else "partial" if reward > 0 else "fail", kind, k)] += 1
    net = {k: push[(k, "pos")] + push[(k, "neg")] for k in ("text", "tool")}
    scale = sum(abs(v) for v in push.values()) or 1.0
    return {"shard": shard.name, "loss_agg": loss_agg, "samples": len(rows), "rollouts": len(last),
            "net_text": round(net["text"], 6), "net_tool": round(net["tool"], 6),
            "net_text_share": round(net["text"] / scale, 4), "net_tool_share": round(net["tool"] / scale, 4),
            "pushes": {f"{k}/{s}": {"answers": turns[(k, s)], "sum_of_weights": round(push[(k, s)], 6)}
                       for k, s in sorted(turns)},
            "endings": {f"{o} last={k} answers={n}": c for (o, k, n), c in sorted(ends.items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="a loop's folder holding shards/grpo-* (HOME/demo for openforge demo)")
    ap.add_argument("--tokenizer", type=Path, help="tokenizer.json (default: the first checkpoint's beside DIR)")
    ap.add_argument("--loss-agg", choices=AGGREGATIONS, default="seq-mean-token-mean",
                    help="the aggregation whose per-token weight is summed (the loop's --loss-agg)")
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    found = args.tokenizer or next(iter(sorted(args.dir.parent.glob("checkpoints/*/tokenizer.json"))), None)
    if found is None or not Path(found).is_file():
        ap.error(f"no tokenizer.json found beside {args.dir}: pass --tokenizer PATH (a checkpoint's)")
    tok = Tokenizer.from_file(str(found))
    shards = sorted(Path(p) for p in glob.glob(str(args.dir / "shards" / "grpo-*")))
    if not shards:
        ap.error(f"{args.dir / 'shards'} holds no grpo-* shard: pass the folder a loop wrote its shards under")
    results = []
    for shard in sorted(shards, key=lambda p: p.stat().st_mtime):
        res = shard_pushes(shard, tok, args.loss_agg)
        results.append(res)
        print(f"{res['shard']}: {res['samples']} samples, {res['rollouts']} rollouts; net first-token push "
              f"({args.loss_agg}): stop {res['net_text']:+.4g} ({res['net_text_share']:+.1%} of all), tool call "
              f"{res['net_tool']:+.4g} ({res['net_tool_share']:+.1%})", file=sys.stderr)
        for k, v in res["pushes"].items():
            print(f"  {k:<10} answers {v['answers']:>4}  sum of weights {v['sum_of_weights']:+.4g}", file=sys.stderr)
        for k, c in res["endings"].items():
            print(f"  ended {k:<40} {c:>3}", file=sys.stderr)
    print(json.dumps({"shards": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
