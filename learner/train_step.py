"""Policy updates of a Hugging Face causal LM on the CPU: GRPO from a veRL shard's samples, or SFT from an SFT shard's
conversations. Run by file path inside an environment with torch and transformers (``openforge train`` uses the
vLLM CPU one); ``learner.train`` prepares the samples (a JSON-lines file) from a verified shard.

    python learner/train_step.py --algorithm grpo|sft --samples S.jsonl --base MODEL_DIR --out CKPT_DIR
                                 [--lr LR] [--epochs N] [--steps N] [--batch-size N]

**GRPO.** Each sample is one exported segment: ``prompt_ids``, ``response_ids``, ``response_mask`` (1 = the policy's
tokens), ``response_logprobs`` (the engine's, for the sampled tokens) and ``advantage``. Departures from the GRPO
paper, as veRL's defaults: no KL term and no reference model unless ``--ref DIR --kl-coef C`` asks for one (then
veRL's ``use_kl_loss``: C times the aggregated ``--kl-type`` estimate of KL(policy || reference) over the sampled
tokens joins the loss, the reference's log-probabilities from a frozen copy in the same precision); the loss is the
PPO-clip surrogate averaged over every masked token of a batch (token-mean); by default the whole shard is one batch (one optimizer step). A sample without
logprobs (the exporter writes null for calls the engine gave none) is trained as on-policy: its ratio is 1
(``exp(logp - logp.detach())``), which leaves the plain policy gradient; the count is reported, and those samples
stay out of the ratio figure. ``importance_ratio_mean`` is exp(trainer logprob - engine logprob) averaged over the
masked tokens of the FIRST batch, before any update; its expectation is 1 whatever the mismatch (E_engine[p/q] = 1),
so ``importance_k3`` (mean of r - 1 - log r over the same tokens, the k3 estimate of KL(engine || trainer)) is the
figure that shows one: ~0 when trainer and engine compute the same distribution.

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
import json
import math
import sys
import time
from pathlib import Path

try:
    from . import _lora as lora
    from ._freeze import FreezeError, train_top
    from ._sft_tokens import StepError, sft_tokens
    from ._step_args import parse
    from ._step_choices import by_tokens, micro_batches, resolve_precision, schedule, weigh_negatives
    from ._step_losses import agg_loss, kl_penalty, policy_loss
    from ._step_save import save
except ImportError:   # run by path (python learner/train_step.py): its folder is on sys.path
    import _lora as lora
    from _freeze import FreezeError, train_top
    from _sft_tokens import StepError, sft_tokens
    from _step_args import parse
    from _step_choices import by_tokens, micro_batches, resolve_precision, schedule, weigh_negatives
    from _step_losses import agg_loss, kl_penalty, policy_loss
    from _step_save import save

# seconds per (token x parameter) of a forward and backward pass, SmolLM2-135M on this 2-core machine: fp32 7.7 s for
# a batch of 8 x 188 tokens; bfloat16 autocast 1.7 s a sample of 450 tokens in batches of 4 (fp32: 3.5 s)
SECONDS_PER_TOKEN_PARAM = {"fp32": 3.8e-11, "bf16": 2.8e-11}

def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _autocast(torch):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=ARGS.precision == "bf16")


def token_logprobs(torch, model, seqs: list[list[int]], targets: list[list[int]]) -> list:
    """For each sequence, the log-probability of ``seq[t]`` given ``seq[:t]`` at every position ``t`` of its
    targets, as a 1-D float32 tensor (with the graph, for backward). One padded forward pass; the output layer and
    the softmax run in float32 on the target positions only (the prompt's positions need no logits)."""
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    with _autocast(torch):
        hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state
    rows = torch.tensor([i for i, ts in enumerate(targets) for _ in ts], dtype=torch.long)
    cols = torch.tensor([t for ts in targets for t in ts], dtype=torch.long)
    logits = model.get_output_embeddings()(hidden[rows, cols - 1].float())
    logp = torch.log_softmax(logits, dim=-1).gather(1, ids[rows, cols].unsqueeze(1)).squeeze(1)
    return list(torch.split(logp, [len(ts) for ts in targets]))


def sft_loss(torch, model, batch: list[tuple[list[int], list[int]]], scale: float = 1.0) -> tuple[float, int]:
    """Backward of the batch's token-mean assistant loss times ``scale`` (accumulated over micro-batches); returns
    (the unscaled loss, tokens)."""
    n_tokens = sum(sum(1 for x in labels[1:] if x != -100) for _, labels in batch)
    total = 0.0
    for micro in micro_batches(batch, lambda s: len(s[0])):
        targets = [[t for t in range(1, len(ids)) if labels[t] != -100] for ids, labels in micro]
        logps = token_logprobs(torch, model, [ids for ids, _ in micro], targets)
        loss = -torch.cat(logps).sum() / max(n_tokens, 1)
        (loss * scale).backward()
        total += float(loss)
    return total, n_tokens


def sft_encoded(tok, samples: list[dict]) -> list[tuple[list[int], list[int]]]:
    """The conversations that fit ``--max-len`` and have assistant tokens, as (ids, labels)."""
    encoded = [sft_tokens(tok, s) for s in samples]
    return [e for e in encoded if len(e[0]) <= ARGS.max_len and any(x != -100 for x in e[1][1:])]


# ---- GRPO: one mini-batch's PPO-clip loss (veRL's, learner/_step_losses.py) ----

def _policy_positions(s: dict) -> list[int]:
    p = len(s["prompt_ids"])
    return [p + j for j, m in enumerate(s["response_mask"]) if m]


def _padded(torch, rows: list[list[float]]):
    width = max(len(r) for r in rows)
    return (torch.tensor([r + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32),
            torch.tensor([[1.0] * len(r) + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32))


def grpo_loss(torch, model, batch: list[dict], horizon: int) -> tuple[float, list[tuple[float, float]], int, dict]:
    """Backward of one mini-batch's policy loss (veRL's vanilla PPO-clip, aggregated over the whole mini-batch
    although it runs in micro-batches); returns (loss, (ratio, log ratio) of each policy token of the samples with
    engine logprobs, policy tokens, metrics)."""
    n_tokens = sum(sum(s["response_mask"]) for s in batch)
    agg = {"batch_num_tokens": n_tokens, "global_batch_size": sum(1 for s in batch if sum(s["response_mask"])),
           "loss_scale_factor": horizon}
    total, ratios, clip, kl = 0.0, [], 0.0, 0.0
    for micro in micro_batches(batch, lambda s: len(s["prompt_ids"]) + len(s["response_ids"])):
        positions = [_policy_positions(s) for s in micro]
        logps = token_logprobs(torch, model, [s["prompt_ids"] + s["response_ids"] for s in micro], positions)
        old = []
        for s, lp in zip(micro, logps):
            engine = s.get("response_logprobs")
            if engine is None:   # the engine gave none: trained on-policy (ratio 1, the plain policy gradient)
                old.append(lp.detach().tolist())
            else:
                old.append([float(engine[j]) for j, m in enumerate(s["response_mask"]) if m])
                log_ratio = lp.detach() - torch.tensor(old[-1])
                ratios += zip(torch.exp(log_ratio).tolist(), log_ratio.tolist())
        _, mask = _padded(torch, [[0.0] * len(lp) for lp in logps])
        logp = torch.nn.utils.rnn.pad_sequence(logps, batch_first=True)
        old_t, _ = _padded(torch, old)
        adv, _ = _padded(torch, [[float(s["advantage"])] * len(lp) for s, lp in zip(micro, logps)])
        weights = None
        if any(s.get("rollout_is_weights") is not None for s in micro):
            weights, _ = _padded(torch, [[float(w) for w, m in zip(s.get("rollout_is_weights") or [1.0] * len(
                s["response_mask"]), s["response_mask"]) if m] for s in micro])
        loss, metrics = policy_loss(torch, old_t, logp, adv, mask, mode=ARGS.loss_agg, clip_low=ARGS.clip_low,
                                    clip_high=ARGS.clip_high, clip_c=ARGS.clip_c, rollout_is_weights=weights, **agg)
        if REF is not None:   # veRL's use_kl_loss: + kl_loss_coef * agg_loss(kl_penalty(logp, ref_logp))
            with torch.no_grad():
                ref = torch.nn.utils.rnn.pad_sequence(token_logprobs(torch, REF, [s["prompt_ids"] + s["response_ids"]
                                                                                 for s in micro], positions), True)
            kld = kl_penalty(torch, logp, ref, ARGS.kl_type)
            loss = loss + ARGS.kl_coef * agg_loss(torch, kld, mask, ARGS.loss_agg, **agg)
            kl += float((kld.detach() * mask).sum())
        loss.backward()
        total += float(loss)
        clip += metrics["clipfrac"] * float(mask.sum())
    return total, ratios, n_tokens, {"clipfrac": clip / max(n_tokens, 1),
                                     **({"kl": kl / max(n_tokens, 1)} if REF is not None else {})}


# ---- the loop, shared ----

def _optimizer(torch, params):
    """AdamW, resumed from ``--optimizer-state`` when that file exists (its moments and step counts carry over from
    the previous update of this chain: no fresh first step that moves every weight by ~lr whatever its gradient)."""
    opt = torch.optim.AdamW(params, lr=ARGS.lr, weight_decay=0.0)
    resumed = False
    if ARGS.optimizer_state and Path(ARGS.optimizer_state).is_file():
        state = torch.load(ARGS.optimizer_state, map_location="cpu", weights_only=True)
        try:
            opt.load_state_dict(state)
        except (ValueError, KeyError) as exc:
            raise StepError(f"--optimizer-state {ARGS.optimizer_state}: it does not fit this model ({exc}); pass "
                            "the state saved by an update of the same model, or none for a fresh AdamW") from None
        for group in opt.param_groups:
            group["lr"] = ARGS.lr
        resumed = True
    return opt, resumed


def _save_optimizer(torch, opt) -> None:
    if ARGS.optimizer_state:
        path = Path(ARGS.optimizer_state)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(opt.state_dict(), tmp)
        tmp.replace(path)


def run(torch, model, batches, step_fn, tokens_of, params: int) -> dict:
    opt, resumed = _optimizer(torch, [p for p in model.parameters() if p.requires_grad])
    total_tokens = sum(tokens_of(b) for b in batches)
    guess = total_tokens * params * SECONDS_PER_TOKEN_PARAM[ARGS.precision]
    budget = f", at most {_minutes(ARGS.max_seconds)}" if ARGS.max_seconds else ""
    say(f"{ARGS.algorithm}: {len(batches)} steps over {total_tokens:,} tokens: about {_minutes(guess)}{budget} (a "
        f"guess from this session's CPU rate; re-estimated after the first step)")
    losses, first, t0, extras = [], {}, time.monotonic(), []
    for k, batch in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        loss, extra = step_fn(batch)
        if k == 0:
            first = extra
        extras.append(extra)
        opt.step()
        losses.append(loss)
        done = time.monotonic() - t0
        left = done / (k + 1) * (len(batches) - k - 1)
        if ARGS.max_seconds:
            left = min(left, max(ARGS.max_seconds - done, 0.0))
        say(f"step {k + 1}/{len(batches)}  loss {loss:.4f}  {done:.1f} s" + (f"  (~{_minutes(left)} left)" if left
                                                                               else ""))
        if ARGS.max_seconds and done >= ARGS.max_seconds:
            batches = batches[:k + 1]
            say(f"stopped after {k + 1} steps: --max-seconds {ARGS.max_seconds:g} spent")
            break
    _save_optimizer(torch, opt)
    clip = [e["clipfrac"] for e in extras if "clipfrac" in e]
    return {"steps": len(batches), "batch_size": max(len(b) for b in batches),
            "epochs": round(sum(len(b) for b in batches) / max(len(set().union(*batches)), 1), 3),
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None, "loss": losses[-1] if losses else None,
            "train_seconds": round(time.monotonic() - t0, 2), "optimizer_resumed": resumed,
            "precision": ARGS.precision, **({"clipfrac_mean": sum(clip) / len(clip)} if clip else {}),
            **{k: v for k, v in first.items() if k != "clipfrac"}}


def anchor_batches(tok, steps: int) -> list:
    """``--anchor-samples``' conversations in batches of ``--anchor-batch-size``, one per GRPO step (going round
    them as often as needed; a shuffle of its own)."""
    anchors = sorted(sft_encoded(tok, [json.loads(x) for x in Path(ARGS.anchor_samples).read_text().splitlines()
                                       if x.strip()]))
    if not anchors:
        raise StepError(f"--anchor-samples {ARGS.anchor_samples}: no conversation has assistant tokens within --max-len")
    return [[anchors[i] for i in b] for b in schedule(len(anchors), ARGS.anchor_batch_size, 1, steps, ARGS.seed + 1)]


def train_grpo(torch, model, samples: list[dict], params: int, tok=None) -> dict:
    fits = [s for s in samples if 0 < len(s["prompt_ids"]) + len(s["response_ids"]) <= ARGS.max_len
            and sum(s["response_mask"]) > 0]
    if not fits:
        raise StepError("no sample has policy tokens within --max-len")
    fits = weigh_negatives(fits, ARGS.negative_weight)
    # No entropy term and, by default, no KL: a zero-advantage sample's policy gradient is exactly zero, so it is not
    # computed (DAPO's dynamic sampling drops such groups too); it would only have enlarged token-mean's denominator.
    # With --kl-coef such a sample would add only KL pull; the samples with signal carry that term too.
    used = sorted([s for s in fits if s["advantage"] != 0] if ARGS.drop_zero_advantage else fits, key=by_tokens)
    if not used:
        raise StepError("every sample has advantage 0: nothing to learn from")
    horizon = max(len(s["response_ids"]) for s in fits)
    batches = schedule(len(used), ARGS.batch_size or len(used), ARGS.epochs, ARGS.steps, ARGS.seed)

    anchors, anchor_losses = (anchor_batches(tok, len(batches)) if ARGS.anchor_samples else []), []
    kls = []

    def step(idx):
        loss, ratios, _, metrics = grpo_loss(torch, model, [used[i] for i in idx], horizon)
        if "kl" in metrics:
            kls.append(metrics.pop("kl"))
        if anchors:   # PPO-ptx: the demonstrations' SFT loss, weighted, in the same optimizer step
            anchor_losses.append(sft_loss(torch, model, anchors[len(anchor_losses)], scale=ARGS.anchor_coef)[0])
        return loss, {"importance_ratio_mean": sum(r for r, _ in ratios) / len(ratios) if ratios else None,
                      "importance_k3": sum(r - 1 - d for r, d in ratios) / len(ratios) if ratios else None,
                      "importance_ratio_tokens": len(ratios), **metrics}

    out = run(torch, model, batches, step, lambda b: sum(len(used[i]["prompt_ids"]) + len(used[i]["response_ids"])
                                                         for i in b), params)
    out["mean_ratio"] = out.get("importance_ratio_mean")   # the name earlier versions reported
    if kls:   # the KL estimate (--kl-type) to the reference over each step's policy tokens, before its update
        out["kl"] = {"coef": ARGS.kl_coef, "type": ARGS.kl_type, "reference": ARGS.ref, "first": kls[0],
                     "last": kls[-1], "mean": sum(kls) / len(kls)}
    if anchor_losses:
        out["anchor"] = {"coef": ARGS.anchor_coef, "loss_first": anchor_losses[0], "loss_last": anchor_losses[-1],
                         "batch_size": ARGS.anchor_batch_size}
    return {"samples": len(used), "skipped": len(samples) - len(fits), "zero_advantage_dropped": len(fits) - len(used),
            "masked_tokens": sum(sum(s["response_mask"]) for s in used),
            "nonzero_advantages": sum(1 for s in fits if s["advantage"] != 0),
            "samples_without_logprobs": sum(1 for s in used if s.get("response_logprobs") is None),
            "rollout_is_weighted_samples": sum(1 for s in used if s.get("rollout_is_weights") is not None),
            "negative_weight": ARGS.negative_weight, "loss_agg": ARGS.loss_agg, "clip": [ARGS.clip_low, ARGS.clip_high, ARGS.clip_c], **out}


def train_sft(torch, model, tok, samples: list[dict], params: int) -> dict:
    used = sorted(sft_encoded(tok, samples))   # (ids, labels) in token order: the shard's follows random ids (by_tokens)
    if not used:
        raise StepError("no conversation has assistant tokens within --max-len")
    batches = schedule(len(used), ARGS.batch_size or 8, ARGS.epochs, ARGS.steps, ARGS.seed)

    def step(idx):
        loss, _ = sft_loss(torch, model, [used[i] for i in idx])
        return loss, {}

    out = run(torch, model, batches, step, lambda b: sum(len(used[i][0]) for i in b), params)
    return {"samples": len(used), "skipped": len(samples) - len(used), "tokens": sum(len(e[0]) for e in used),
            "assistant_tokens": sum(sum(1 for x in e[1][1:] if x != -100) for e in used), **out}


ARGS: argparse.Namespace
REF = None   # --ref: the reference model of the KL term (frozen, eval mode)


def main(argv: list[str] | None = None) -> int:
    global ARGS, REF
    ARGS = parse(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(ARGS.seed)
    asked, ARGS.precision = ARGS.precision, resolve_precision(torch, ARGS.precision)
    if asked == "auto":
        why = ("native bfloat16" if ARGS.precision == "bf16" else
               f"no native bfloat16 on this CPU ({torch.backends.cpu.get_cpu_capability()}): bf16 would be emulated")
        say(f"precision: {ARGS.precision} ({why})")
    t0 = time.monotonic()
    base, out = Path(ARGS.base), Path(ARGS.out)
    samples = [json.loads(line) for line in Path(ARGS.samples).read_text().splitlines() if line.strip()]
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.train()
    if ARGS.ref:
        REF = AutoModelForCausalLM.from_pretrained(ARGS.ref, dtype=torch.float32).eval().requires_grad_(False)
    params = sum(p.numel() for p in model.parameters())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    handles = lora.attach(torch, model, ARGS.lora_rank, ARGS.lora_alpha) if ARGS.lora_rank else []
    try:
        frozen = train_top(model, ARGS.train_layers)
        if ARGS.algorithm == "sft":
            result = train_sft(torch, model, AutoTokenizer.from_pretrained(base), samples, params)
        else:
            result = train_grpo(torch, model, samples, params,
                                AutoTokenizer.from_pretrained(base) if ARGS.anchor_samples else None)
    except (StepError, FreezeError) as exc:
        say(f"error: {exc}")
        return 2
    if frozen:
        result["train_layers"] = frozen
    if handles:
        lora.merge(torch, model, handles)
        result["lora"] = {"rank": ARGS.lora_rank, "alpha": ARGS.lora_alpha, "adapted_layers": len(handles),
                          "trained_parameters": sum(p.numel() for p in lora.parameters(handles))}
    delta = math.sqrt(sum(float((p.detach() - before[n]).pow(2).sum()) for n, p in model.named_parameters()))
    sha = save(model, base, out)
    print(json.dumps({"algorithm": ARGS.algorithm, **result, "lr": ARGS.lr, "weight_delta_l2": delta,
                      "checkpoint": str(out), "checkpoint_sha256": sha, "seconds": round(time.monotonic() - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
