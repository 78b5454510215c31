"""Low-rank adapters for the CPU train step: ``W x + (alpha / r) B A x`` on a model's linear layers, trained while
the base weights stay frozen, then merged into them, so the checkpoint the engine loads is a plain model.

Why: an RL episode carries about one bit of information, so a few hundred episodes cannot fill 135M parameters;
an update confined to a low-rank subspace keeps the noise of a small batch out of every other direction
(Thinking Machines, "LoRA Without Regret", 2025: rank 1 matched full fine-tuning for policy-gradient RL, with a
learning rate about ten times higher). It is also cheaper: no gradient for the base weights, an optimizer over a
few million parameters.

A new adapter each update (A Kaiming-uniform, B zero, as the LoRA paper initialises them: the merged model starts
as the base), merged at the end. ``torch`` is passed in so that this module imports nothing (the step script runs
it by path in another environment).
"""

from __future__ import annotations

import math

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def attach(torch, model, rank: int, alpha: float, targets=TARGETS) -> list:
    """Freeze ``model`` and wrap every linear layer named in ``targets`` with an adapter; returns the handles
    ``merge`` needs. Refuses a model with no such layer (the names are Llama's, which SmolLM2 uses)."""

    class Adapted(torch.nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base = base
            self.lora_a = torch.nn.Parameter(torch.empty(rank, base.in_features))
            torch.nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
            self.lora_b = torch.nn.Parameter(torch.zeros(base.out_features, rank))
            self.scale = alpha / rank

        def forward(self, x):
            return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale

    for p in model.parameters():
        p.requires_grad_(False)
    handles = []
    for name, module in list(model.named_modules()):
        for attr in targets:
            child = getattr(module, attr, None)
            if isinstance(child, torch.nn.Linear):
                wrapped = Adapted(child)
                setattr(module, attr, wrapped)
                handles.append((module, attr, wrapped))
    if not handles:
        raise ValueError(f"no linear layer named {', '.join(targets)} in the model: LoRA needs them")
    return handles


def parameters(handles: list) -> list:
    return [p for _, _, w in handles for p in (w.lora_a, w.lora_b)]


def merge(torch, model, handles: list) -> None:
    """Fold each adapter into its base weight and put the plain layer back; every parameter trainable again."""
    with torch.no_grad():
        for module, attr, wrapped in handles:
            wrapped.base.weight += wrapped.scale * (wrapped.lora_b @ wrapped.lora_a)
            setattr(module, attr, wrapped.base)
    for p in model.parameters():
        p.requires_grad_(True)
