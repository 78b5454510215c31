"""One GRPO policy-gradient step of a Hugging Face causal LM on the CPU, from exported samples (a JSON-lines file).

Run by file path inside an environment with torch and transformers (``openforge train`` uses the vLLM CPU one):

    python learner/train_step.py --samples S.jsonl --base MODEL_DIR --out CKPT_DIR [--lr 1e-5] [--clip 0.2]

Each sample is one exported segment: ``prompt_ids``, ``response_ids``, ``response_mask`` (1 = the policy's
tokens), ``response_logprobs`` (the behaviour policy's, from the engine) and ``advantage`` (GRPO, per rollout).
Departures from the GRPO paper, as veRL's defaults: no KL term and no reference model; the loss is the PPO-clip
surrogate averaged over every masked token of the batch (token-mean), one optimizer step over the whole shard
(gradient accumulation over micro-batches of one sample). AdamW has no weight decay, so a step with all advantages
zero leaves the weights exactly as they were; the result says so instead of pretending the policy moved.

Prints one JSON object: samples used / skipped, masked tokens, loss, mean importance ratio, the L2 norm of the
weight change, the checkpoint's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    t0 = time.monotonic()
    samples = [json.loads(line) for line in Path(args.samples).read_text().splitlines() if line.strip()]
    used = [s for s in samples if 0 < len(s["prompt_ids"]) + len(s["response_ids"]) <= args.max_len
            and sum(s["response_mask"]) > 0]
    skipped = len(samples) - len(used)
    model = AutoModelForCausalLM.from_pretrained(args.base, torch_dtype=torch.float32)
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    n_tokens = sum(sum(s["response_mask"]) for s in used)
    total_loss, ratios = 0.0, []
    opt.zero_grad(set_to_none=True)
    for s in used:
        ids = torch.tensor([s["prompt_ids"] + s["response_ids"]])
        p, r = len(s["prompt_ids"]), len(s["response_ids"])
        logits = model(ids).logits[0, p - 1:p + r - 1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, p:p + r].unsqueeze(1)).squeeze(1)
        old = torch.tensor(s["response_logprobs"], dtype=torch.float32)
        mask = torch.tensor(s["response_mask"], dtype=torch.float32)
        ratio = torch.exp(logp - old)
        adv = float(s["advantage"])
        surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - args.clip, 1 + args.clip) * adv)
        loss = -(surrogate * mask).sum() / max(n_tokens, 1)
        loss.backward()
        total_loss += float(loss)
        ratios.append(float((ratio.detach() * mask).sum() / mask.sum()))
    opt.step()
    delta = math.sqrt(sum(float((p.detach() - before[n]).pow(2).sum()) for n, p in model.named_parameters()))
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in Path(args.base).iterdir():   # tokenizer, chat template, generation config: unchanged
        if f.is_file() and not f.name.startswith(".") and not f.name.endswith((".safetensors", ".bin")) \
                and not (tmp / f.name).exists():
            shutil.copy2(f, tmp / f.name)
    digest = hashlib.sha256()
    for f in sorted(tmp.glob("*.safetensors")):
        digest.update(f.read_bytes())
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(json.dumps({"samples": len(used), "skipped": skipped, "masked_tokens": n_tokens, "loss": total_loss,
                      "mean_ratio": sum(ratios) / len(ratios) if ratios else None,
                      "nonzero_advantages": sum(1 for s in used if s["advantage"] != 0),
                      "weight_delta_l2": delta, "checkpoint": str(out), "checkpoint_sha256": digest.hexdigest(),
                      "seconds": round(time.monotonic() - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
