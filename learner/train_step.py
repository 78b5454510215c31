"""Policy updates of a Hugging Face causal LM on the CPU: GRPO from a veRL shard's samples, or SFT from an SFT shard's
conversations. Run by file path inside an environment with torch and transformers (``openforge train`` uses the
vLLM CPU one); ``learner.train`` prepares the samples (a JSON-lines file) from a verified shard.

    python learner/train_step.py --algorithm grpo|sft --samples S.jsonl --base MODEL_DIR --out CKPT_DIR
                                 [--lr LR] [--epochs N] [--steps N] [--batch-size N]

**GRPO.** Each sample is one exported segment: ``prompt_ids``, ``response_ids``, ``response_mask`` (1 = the policy's
tokens), ``response_logprobs`` (the engine's, for the sampled tokens) and ``advantage``. Departures from the GRPO
paper, as veRL's defaults: no KL term and no reference model; the loss is the PPO-clip surrogate averaged over every
masked token of a batch (token-mean); by default the whole shard is one batch (one optimizer step). A sample without
logprobs (the exporter writes null for calls the engine gave none) is trained as on-policy: its ratio is 1
(``exp(logp - logp.detach())``), which leaves the plain policy gradient; the count is reported, and those samples
stay out of the ratio figure. ``importance_ratio_mean`` is exp(trainer logprob - engine logprob) averaged over the
masked tokens of the FIRST batch, before any update: ~1.0 when trainer and engine compute the same distribution.

**SFT.** Each sample is a conversation (``messages``, ``tools``) rendered with the checkpoint folder's own chat
template (the text the engine serves); the loss is next-token cross-entropy on the assistant tokens only, averaged
over a batch's assistant tokens. The assistant tokens are the template's ``{% generation %}`` spans when it marks
them (transformers' ``return_assistant_tokens_mask``), else each assistant message's rendering after the generation
prompt, found by rendering the conversation prefix by prefix (a template that does not render prefixes stably is
an error, not a guess). Defaults from this session's probe (SmolLM2-135M learned one-step shell tasks from 96
demonstrations): AdamW lr 1e-4, batch 8, no weight decay.

Progress goes to stderr (an estimate before the first step, then every step); the result is one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import shutil
import sys
import time
from pathlib import Path

SECONDS_PER_TOKEN_PARAM = 3.8e-11   # measured: 7.7 s for a batch of 8 x 188 tokens, SmolLM2-135M, 2 CPU threads
TOKEN_BUDGET = 4096                 # padded tokens per forward pass (micro-batch); bounds the logits' memory
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


class StepError(RuntimeError):
    pass


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


# ---- SFT: conversations -> token ids and assistant labels ----

def _render(tok, messages, tools, **kw) -> str:
    return tok.apply_chat_template(messages, tools=tools or None, tokenize=False, **kw)


def _assistant_spans(tok, messages: list[dict], tools) -> tuple[str, list[tuple[int, int]]]:
    """The full text and the character spans of each assistant message's generated part, prefix by prefix."""
    full = _render(tok, messages, tools)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = _render(tok, messages[:i], tools, add_generation_prompt=True) if i else ""
        end = _render(tok, messages[:i + 1], tools)
        if not (end.startswith(start) and full.startswith(end)):
            raise StepError("the chat template does not render a conversation's prefixes as prefixes of the whole "
                            "(message %d), so its assistant tokens cannot be located; mark them with "
                            "{%% generation %%} in the template" % i)
        spans.append((len(start), len(end)))
    return full, spans


def sft_tokens(tok, sample: dict) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 outside the assistant's tokens) of one conversation."""
    messages, tools = sample["messages"], sample.get("tools")
    if _GENERATION.search(tok.chat_template or ""):
        enc = tok.apply_chat_template(messages, tools=tools or None, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        ids = list(enc["input_ids"])
        return ids, [t if m else -100 for t, m in zip(ids, enc["assistant_masks"])]
    text, spans = _assistant_spans(tok, messages, tools)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    labels = [t if any(s <= a and b <= e for s, e in spans) and b > a else -100
              for t, (a, b) in zip(enc["input_ids"], enc["offset_mapping"])]
    return list(enc["input_ids"]), labels


def _micro_batches(batch: list, length) -> list[list]:
    """Split a batch so that each forward pass holds at most TOKEN_BUDGET padded tokens."""
    out, cur = [], []
    for s in batch:
        if cur and max(length(x) for x in cur + [s]) * (len(cur) + 1) > TOKEN_BUDGET:
            out.append(cur)
            cur = []
        cur.append(s)
    return out + ([cur] if cur else [])


def sft_loss(torch, model, batch: list[tuple[list[int], list[int]]], pad: int) -> tuple[float, int]:
    """Backward of the batch's token-mean assistant loss (accumulated over micro-batches); returns (loss, tokens)."""
    n_tokens = sum(sum(1 for x in labels[1:] if x != -100) for _, labels in batch)
    total = 0.0
    for micro in _micro_batches(batch, lambda s: len(s[0])):
        width = max(len(ids) for ids, _ in micro)
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in micro])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in micro])
        attn = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in micro])
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                                 ignore_index=-100, reduction="sum") / max(n_tokens, 1)
        loss.backward()
        total += float(loss)
    return total, n_tokens


# ---- GRPO: one batch's PPO-clip surrogate ----

def grpo_loss(torch, model, batch: list[dict], clip: float) -> tuple[float, list[float], int]:
    """Backward of the batch's token-mean surrogate; returns (loss, per-token ratios of samples with logprobs,
    masked tokens)."""
    n_tokens = sum(sum(s["response_mask"]) for s in batch)
    total, ratios = 0.0, []
    for s in batch:
        ids = torch.tensor([s["prompt_ids"] + s["response_ids"]])
        p, r = len(s["prompt_ids"]), len(s["response_ids"])
        logits = model(ids).logits[0, p - 1:p + r - 1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, p:p + r].unsqueeze(1)).squeeze(1)
        mask = torch.tensor(s["response_mask"], dtype=torch.float32)
        if s.get("response_logprobs") is None:
            old = logp.detach()   # on-policy: ratio 1, the plain policy gradient
        else:
            old = torch.tensor(s["response_logprobs"], dtype=torch.float32)
        ratio = torch.exp(logp - old)
        adv = float(s["advantage"])
        surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
        loss = -(surrogate * mask).sum() / max(n_tokens, 1)
        loss.backward()
        total += float(loss)
        if s.get("response_logprobs") is not None:
            ratios += [float(x) for x, m in zip(ratio.detach(), s["response_mask"]) if m]
    return total, ratios, n_tokens


# ---- the loop, shared ----

def schedule(n: int, batch_size: int, epochs: int, steps: int | None, seed: int) -> list[list[int]]:
    """Batches of sample indices: each epoch a fresh shuffle (seeded), cut into batches; ``steps`` (if given)
    takes that many batches, going round the epochs as often as needed."""
    batches: list[list[int]] = []
    epoch = 0
    while (steps is None and epoch < epochs) or (steps is not None and len(batches) < steps):
        order = list(range(n))
        random.Random(seed + epoch).shuffle(order)
        batches += [order[i:i + batch_size] for i in range(0, n, batch_size)]
        epoch += 1
    return batches[:steps] if steps is not None else batches


def run(torch, model, batches, step_fn, tokens_of, params: int) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=ARGS.lr, weight_decay=0.0)
    total_tokens = sum(tokens_of(b) for b in batches)
    guess = total_tokens * params * SECONDS_PER_TOKEN_PARAM
    say(f"{ARGS.algorithm}: {len(batches)} steps over {total_tokens:,} tokens: about {_minutes(guess)} (a guess from "
        f"this session's CPU rate; re-estimated after the first step)")
    losses, first, t0 = [], {}, time.monotonic()
    for k, batch in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        loss, extra = step_fn(batch)
        if k == 0:
            first = extra
        opt.step()
        losses.append(loss)
        done = time.monotonic() - t0
        left = done / (k + 1) * (len(batches) - k - 1)
        say(f"step {k + 1}/{len(batches)}  loss {loss:.4f}  {done:.1f} s" + (f"  (~{_minutes(left)} left)" if left
                                                                               else ""))
    return {"steps": len(batches), "batch_size": max(len(b) for b in batches),
            "epochs": round(sum(len(b) for b in batches) / max(len(set().union(*batches)), 1), 3),
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None, "loss": losses[-1] if losses else None,
            "train_seconds": round(time.monotonic() - t0, 2), **first}


def train_grpo(torch, model, samples: list[dict], params: int) -> dict:
    used = [s for s in samples if 0 < len(s["prompt_ids"]) + len(s["response_ids"]) <= ARGS.max_len
            and sum(s["response_mask"]) > 0]
    if not used:
        raise StepError("no sample has policy tokens within --max-len")
    batches = schedule(len(used), ARGS.batch_size or len(used), ARGS.epochs, ARGS.steps, ARGS.seed)

    def step(idx):
        loss, ratios, _ = grpo_loss(torch, model, [used[i] for i in idx], ARGS.clip)
        return loss, {"importance_ratio_mean": sum(ratios) / len(ratios) if ratios else None,
                      "importance_ratio_tokens": len(ratios)}

    out = run(torch, model, batches, step, lambda b: sum(len(used[i]["prompt_ids"]) + len(used[i]["response_ids"])
                                                         for i in b), params)
    out["mean_ratio"] = out.get("importance_ratio_mean")   # the name earlier versions reported
    return {"samples": len(used), "skipped": len(samples) - len(used),
            "masked_tokens": sum(sum(s["response_mask"]) for s in used),
            "nonzero_advantages": sum(1 for s in used if s["advantage"] != 0),
            "samples_without_logprobs": sum(1 for s in used if s.get("response_logprobs") is None), **out}


def train_sft(torch, model, tok, samples: list[dict], params: int) -> dict:
    encoded = [sft_tokens(tok, s) for s in samples]
    used = [e for e in encoded if len(e[0]) <= ARGS.max_len and any(x != -100 for x in e[1][1:])]
    if not used:
        raise StepError("no conversation has assistant tokens within --max-len")
    batches = schedule(len(used), ARGS.batch_size or 8, ARGS.epochs, ARGS.steps, ARGS.seed)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    def step(idx):
        loss, _ = sft_loss(torch, model, [used[i] for i in idx], pad)
        return loss, {}

    out = run(torch, model, batches, step, lambda b: sum(len(used[i][0]) for i in b), params)
    return {"samples": len(used), "skipped": len(samples) - len(used), "tokens": sum(len(e[0]) for e in used),
            "assistant_tokens": sum(sum(1 for x in e[1][1:] if x != -100) for e in used), **out}


def save(model, base: Path, out: Path) -> str:
    """Write the checkpoint (weights, then the base's tokenizer, chat template and configs) and return the sha256
    of its weights."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in base.iterdir():   # tokenizer, chat template, generation config: unchanged
        if f.is_file() and not f.name.startswith(".") and not f.name.endswith((".safetensors", ".bin")) \
                and not (tmp / f.name).exists():
            shutil.copy2(f, tmp / f.name)
    digest = hashlib.sha256()
    for f in sorted(tmp.glob("*.safetensors")):
        digest.update(f.read_bytes())
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return digest.hexdigest()


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithm", choices=("grpo", "sft"), default="grpo")
    ap.add_argument("--samples", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lr", type=float, default=None, help="default: 1e-5 (grpo), 1e-4 (sft)")
    ap.add_argument("--epochs", type=int, default=None, help="passes over the samples; default: 1 (grpo), 3 (sft)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (instead of --epochs)")
    ap.add_argument("--batch-size", type=int, default=None, help="default: the whole shard (grpo), 8 (sft)")
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sft = args.algorithm == "sft"
    args.lr = args.lr if args.lr is not None else (1e-4 if sft else 1e-5)
    args.epochs = args.epochs if args.epochs is not None else (3 if sft else 1)
    for name in ("epochs", "steps", "batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: pass 1 or more")
    return args


ARGS: argparse.Namespace


def main(argv: list[str] | None = None) -> int:
    global ARGS
    ARGS = parse(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(ARGS.seed)
    t0 = time.monotonic()
    base, out = Path(ARGS.base), Path(ARGS.out)
    samples = [json.loads(line) for line in Path(ARGS.samples).read_text().splitlines() if line.strip()]
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        if ARGS.algorithm == "sft":
            result = train_sft(torch, model, AutoTokenizer.from_pretrained(base), samples, params)
        else:
            result = train_grpo(torch, model, samples, params)
    except StepError as exc:
        say(f"error: {exc}")
        return 2
    delta = math.sqrt(sum(float((p.detach() - before[n]).pow(2).sum()) for n, p in model.named_parameters()))
    sha = save(model, base, out)
    print(json.dumps({"algorithm": ARGS.algorithm, **result, "lr": ARGS.lr, "weight_delta_l2": delta, "checkpoint": str(out),
                      "checkpoint_sha256": sha, "seconds": round(time.monotonic() - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
