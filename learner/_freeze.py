"""Train only the top of the network: every weight frozen but the last ``k`` decoder blocks and the final norm.

Why: on this 2-core CPU the train step's cost is compute (the forward and backward passes over every token).
Autograd keeps no graph below the lowest trainable block, so the backward pass stops there: with 10 of SmolLM2's 30
blocks trained, a forward and backward pass over 4 x 1,000 tokens took 13.6 s against 27.8 s for the whole model
(15 blocks: 17.5 s; fp32, this kind of machine, 2026-12-03). The tied embedding and output layer stay frozen too:
the output layer's weight gradient is the largest single one (49,152 x 576) and the embedding it is tied to is what
every frozen block reads.

Not a default, and why: on the demo's SFT (``bench/sft_plateau.py --train-layers 10``, seed 100, bf16 autocast) an
epoch took 55-70 s against 130 s for every weight, but held-out success after epochs 1-4 was 0, 2, 1, 1 of 48
against 9 of 48 after ONE epoch of the full fine-tune: the format was learned (training loss 1.29 -> 0.53), the
tasks were not. It is an option for experiments (GRPO updates confined to the top of the network).

``torch`` is passed in so that this module imports nothing (the step script runs it by path in another environment).
"""

from __future__ import annotations


class FreezeError(ValueError):
    """A ``--train-layers`` the model cannot take; the message names the value, the rule and the fix."""


def train_top(model, k: int) -> dict:
    """Freeze ``model`` except its last ``k`` decoder blocks and the decoder's final norm; returns what is trained.
    ``k`` of 0 leaves every weight trainable (a full fine-tune)."""
    decoder = model.get_decoder()
    blocks = getattr(decoder, "layers", None)
    if blocks is None:
        raise FreezeError(f"--train-layers {k}: this model's decoder ({type(decoder).__name__}) has no `layers` list "
                          "of blocks to choose from; pass --train-layers 0 (every weight)")
    if not 0 <= k <= len(blocks):
        raise FreezeError(f"--train-layers {k}: the model has {len(blocks)} decoder blocks; pass 0 (every weight) "
                          f"or 1 to {len(blocks)}")
    if k == 0:
        return {}
    for p in model.parameters():
        p.requires_grad_(False)
    trained = [*blocks[len(blocks) - k:]] + ([decoder.norm] if getattr(decoder, "norm", None) is not None else [])
    for module in trained:
        for p in module.parameters():
            p.requires_grad_(True)
    return {"layers": k, "of_layers": len(blocks),
            "trained_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}
