"""Teacher-forced logprobs of stored completions under a Hugging Face checkpoint, on the CPU. Run by file path in an
environment with torch and transformers (``openforge rescore`` uses the vLLM CPU one); ``learner.rescore`` writes
the calls and stores what this prints.

    python learner/rescore_step.py --model CKPT_DIR --calls CALLS.jsonl [--dtype float32|bfloat16] [--threads N]

Each input line is one call: ``{"call_id", "rollout_id", "prompt_ids", "completion_ids"}``, the token ids as the
store holds them (never re-tokenized), a rollout's calls together. The first output line is the scorer's lineage
(``{"lineage": {...}}``); then one line per call, in input order, as soon as it is scored:
``{"call_id", "logprobs": [...]}``, the logprob of each completion token given everything before it.

A causal model's logprob at position t depends on the tokens up to t only, so a call whose prompt + completion is a
prefix of a later call of the same rollout (an agent's turns usually are) takes its logprobs from that call's
forward pass: a rollout of T turns costs one pass over its longest sequence instead of T passes. The logits are
computed only where a completion token is scored, in float32, a chunk of positions at a time.

Across rollouts, the start is shared too: rollouts of one harness begin with the same system prompt and tool list,
and a GRPO group's rollouts with the same task. The keys and values of the last sequence passed through the model
are kept, and the next sequence's pass starts after the tokens the two have in common (at least ``MIN_SHARED``;
never past the first position to score), from a copy of those keys and values. Attention over cached keys computes
the same sums in another order, so logprobs move in the last float32 digits only.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

CHUNK = 512   # positions whose logits are in memory at once (512 x 49,152 vocabulary x 4 bytes: 100 MB)
MIN_SHARED = 32   # fewer tokens in common with the cached sequence: a plain pass (copying the cache would not pay)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _rollouts(path: Path):
    """The input's calls, a rollout at a time."""
    group, current = [], object()
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            call = json.loads(line)
            if group and call.get("rollout_id") != current:
                yield group
                group = []
            current = call.get("rollout_id")
            group.append(call)
    if group:
        yield group


class SharedStart:
    """The keys and values of the last sequence through the model, for the next one's common start."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.cache = None
        self.reused = 0   # tokens not passed through the model again thanks to it

    def start(self, ids: list[int], first: int) -> tuple[int, object]:
        """How many leading tokens of ``ids`` need no pass (``first``: the first position whose hidden state is
        needed), and a cache holding them (None: a plain pass)."""
        n, most = 0, min(len(self.ids), first)
        while n < most and self.ids[n] == ids[n]:
            n += 1
        if n < MIN_SHARED or self.cache is None:
            return 0, None
        cache = copy.deepcopy(self.cache)
        if len(self.ids) > n:
            cache.crop(n - len(self.ids))   # drop the tokens after the common start
        self.reused += n
        return n, cache


def _forward(torch, model, ids: list[int], positions: list[int], dtype, shared: SharedStart | None = None):
    """logprob of ``ids[t]`` given ``ids[:t]`` for each t in ``positions`` (sorted, all >= 1)."""
    x = torch.tensor([ids])
    skip, cache = shared.start(ids, positions[0] - 1) if shared is not None else (0, None)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        if shared is None:
            hidden = model.get_decoder()(input_ids=x).last_hidden_state[0]
        else:
            if cache is None:
                from transformers import DynamicCache

                cache = DynamicCache(config=model.config)
            res = model.get_decoder()(input_ids=x[:, skip:], past_key_values=cache, use_cache=True)
            hidden = res.last_hidden_state[0]
            shared.ids, shared.cache = ids, res.past_key_values
        out = []
        head = model.get_output_embeddings()
        for i in range(0, len(positions), CHUNK):
            pos = torch.tensor(positions[i:i + CHUNK])
            logits = head(hidden[pos - 1 - skip]).float()
            logp = torch.log_softmax(logits, dim=-1).gather(1, x[0, pos].unsqueeze(1)).squeeze(1)
            out += logp.tolist()
    return out


def score_rollout(torch, model, calls: list[dict], dtype, shared: SharedStart | None = None
                  ) -> tuple[dict[str, list[float]], int]:
    """Each call's completion logprobs; and how many tokens went through the model."""
    done: list[tuple[list[int], dict[int, float]]] = []   # scored sequences: ids, position -> logprob
    out, forwarded = {}, 0
    for c in sorted(calls, key=lambda c: len(c["prompt_ids"]) + len(c["completion_ids"]), reverse=True):
        full = c["prompt_ids"] + c["completion_ids"]
        p = len(c["prompt_ids"])
        want = list(range(p, len(full)))
        if p < 1:
            raise ValueError(f"call {c['call_id']}: no prompt token before its completion; nothing conditions "
                             "the first completion token, so it cannot be scored")
        host = next((d for d in done if len(d[0]) >= len(full) and d[0][:len(full)] == full
                     and all(t in d[1] for t in want)), None)
        if host is None:
            # score every position after the first prompt token of this sequence that a shorter call may need:
            # the completion positions of the calls that are a prefix of it
            need = set(want)
            for o in calls:
                of = o["prompt_ids"] + o["completion_ids"]
                if len(of) <= len(full) and full[:len(of)] == of:
                    need.update(range(len(o["prompt_ids"]), len(of)))
            positions = sorted(need)
            host = (full, dict(zip(positions, _forward(torch, model, full, positions, dtype, shared))))
            forwarded += len(full)
            done.append(host)
        out[c["call_id"]] = [host[1][t] for t in want]
    return out, forwarded


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--calls", required=True)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--no-shared-start", dest="shared_start", action="store_false",
                    help="pass every sequence through the model from its first token (no keys and values reused "
                    "across rollouts)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's own choice); several workers at "
                    "once each take a share of the cores")
    args = ap.parse_args(argv)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    print(json.dumps({"lineage": {"engine": "transformers", "engine_version": transformers.__version__,
                                  "torch": torch.__version__, "dtype": args.dtype, "device": "cpu",
                                  "threads": torch.get_num_threads(), "shared_start": args.shared_start}}),
          flush=True)
    t0, calls, tokens, forwarded = time.monotonic(), 0, 0, 0
    shared = SharedStart() if args.shared_start else None
    for group in _rollouts(Path(args.calls)):
        try:
            scored, n = score_rollout(torch, model, group, dtype, shared)
        except ValueError as exc:
            say(f"error: {exc}")
            return 2
        forwarded += n
        for c in group:
            print(json.dumps({"call_id": c["call_id"], "logprobs": scored[c["call_id"]]}), flush=True)
            calls += 1
            tokens += len(c["completion_ids"])
    reused = shared.reused if shared is not None else 0
    say(f"rescore-step: {calls} calls, {tokens} completion tokens, {forwarded - reused} tokens through the model "
        f"({reused} more read from a shared start) in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
