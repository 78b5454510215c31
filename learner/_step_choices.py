"""The train step's choices that need no model: the precision it computes in, how negative advantages weigh, the
order of the samples (``by_tokens``, ``schedule``) and how a batch is cut into forward passes (``micro_batches``).
Kept apart from ``train_step.py`` (which runs by path in the torch environment) so that they are tested without
torch."""

from __future__ import annotations

import random

TOKEN_BUDGET = 4096                 # padded tokens per forward pass (micro-batch); bounds the logits' memory


def resolve_precision(torch, asked: str) -> str:
    """``auto`` -> bf16 where oneDNN computes bfloat16 natively, else fp32. Measured on an AVX2-only AMD EPYC of
    this kind of machine: a 1024x1024 matmul under bf16 autocast took 60x as long as in fp32 (emulated), so bf16 is
    never a safe default on a CPU whose capability is not known."""
    if asked != "auto":
        return asked
    try:
        native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):   # a torch without the probe: assume nothing
        native = False
    return "bf16" if native else "fp32"


def weigh_negatives(samples: list[dict], weight: float) -> list[dict]:
    """Negative advantages scaled by ``weight`` (1: GRPO as is; 0: only the group's better-than-average samples pull,
    the rest then have advantage 0 and are dropped). The positive ones are left alone."""
    if weight == 1.0:
        return samples
    return [dict(s, advantage=s["advantage"] * weight) if s["advantage"] < 0 else s for s in samples]


def by_tokens(sample: dict) -> tuple:
    """A GRPO sample's place before the shuffle: its tokens and advantage. ``schedule`` shuffles indices, so the
    samples' order going in decides the batches; a shard lists its rows by group and rollout id, which the
    orchestrator draws at random, so in the shard's order the same samples and seed made other batches each run.
    (SFT sorts its encoded conversations the same way; ids the template does not render, such as tool call ids,
    do not count.)"""
    return sample["prompt_ids"], sample["response_ids"], sample["response_mask"], sample["advantage"]


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


def micro_batches(batch: list, length) -> list[list]:
    """Split a batch so that each forward pass holds at most TOKEN_BUDGET padded tokens, longest first (samples of
    like length share a pass, so little of it is padding; the batch's loss is a sum, whatever the order)."""
    out, cur = [], []
    for s in sorted(batch, key=length, reverse=True):
        if cur and max(length(x) for x in cur + [s]) * (len(cur) + 1) > TOKEN_BUDGET:
            out.append(cur)
            cur = []
        cur.append(s)
    return out + ([cur] if cur else [])
