"""Where a GRPO round's update pushes a turn's first decision: stop (a text answer) or open a tool call.

Reads the veRL shards a loop left (``DIR/shards/grpo-*``: ``openforge demo`` with ``OPENFORGE_HOME=HOME`` writes
them under ``HOME/demo``) and, for every policy span of every sample (one span = one model answer: a run of
``response_mask`` 1s), sorts the answer by its first tokens into ``text`` (the turn ends) or ``tool`` (it opens a
``<tool_call>``), and adds the weight the loss gives that span's first token: ``advantage / policy tokens of the
sample``, as ``seq-mean-token-mean`` (the demo's aggregation) weighs it. A positive net sum means the round's
gradient raises that opening where it was sampled, summed over the shard. Also counts how each rollout ended.

    python bench/shard_pushes.py DIR [--tokenizer tokenizer.json]

Prints a table per shard; the last line is one JSON object (per shard: ``net_text``, ``net_tool``, the counts).
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


def shard_pushes(shard: Path, tok) -> dict:
    import pyarrow.parquet as pq

    rows = [r for f in sorted(shard.glob("trajectories-*.parquet")) for r in pq.read_table(f).to_pylist()]
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
            push[(kind, sign)] += adv / n
            turns[(kind, sign)] += 1
        prev = last.get(r["rollout_id"], (0.0, "", 0))
        last[r["rollout_id"]] = (float(r["reward_score"]), kinds[-1], prev[2] + len(kinds))
    for reward, kind, k in last.values():
        ends[("success" if reward >= 1 else "partial" if reward > 0 else "fail", kind, k)] += 1
    return {"shard": shard.name, "samples": len(rows), "rollouts": len(last),
            "net_text": round(push[("text", "pos")] + push[("text", "neg")], 4),
            "net_tool": round(push[("tool", "pos")] + push[("tool", "neg")], 4),
            "pushes": {f"{k}/{s}": {"answers": turns[(k, s)], "sum_adv_over_len": round(push[(k, s)], 4)}
                       for k, s in sorted(turns)},
            "endings": {f"{o} last={k} answers={n}": c for (o, k, n), c in sorted(ends.items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="a loop's folder holding shards/grpo-* (HOME/demo for openforge demo)")
    ap.add_argument("--tokenizer", type=Path, help="tokenizer.json (default: the first checkpoint's beside DIR)")
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
        res = shard_pushes(shard, tok)
        results.append(res)
        print(f"{res['shard']}: {res['samples']} samples, {res['rollouts']} rollouts; net first-token push: "
              f"stop {res['net_text']:+.3f}, tool call {res['net_tool']:+.3f}", file=sys.stderr)
        for k, v in res["pushes"].items():
            print(f"  {k:<10} answers {v['answers']:>4}  sum adv/len {v['sum_adv_over_len']:+.3f}", file=sys.stderr)
        for k, c in res["endings"].items():
            print(f"  ended {k:<40} {c:>3}", file=sys.stderr)
    print(json.dumps({"shards": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
