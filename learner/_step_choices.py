"""Two choices of the train step that need no model: the precision it computes in and how negative advantages
weigh. Kept apart from ``train_step.py`` (which runs by path in the torch environment) so that they are tested
without torch."""

from __future__ import annotations


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
