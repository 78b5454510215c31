"""The GRPO recipe of the learning loop: what one round samples and how the policy is updated from it.

Kept apart from the loop's phases so that the choices, and why, are read in one place. The defaults are the best
recipe measured so far (the README's tables: `openforge demo` runs and ``bench/learning_curve.py``), each with the
run it was chosen on; every field is an option of ``openforge demo`` and of the benches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


class RecipeError(ValueError):
    """A recipe setting out of its range; the message names the value, the rule and the fix."""


@dataclass
class GrpoRecipe:
    rounds: int = 3
    tasks_per_round: int = 8
    group_size: int = 8
    temperature: float = 1.0
    # dynamic sampling, lr 1e-5 and the SFT anchor together: 2026-12-05, seeds 0, 1, 2 (bench/learning_curve.py; README)
    signal_groups: int = 8        # > 0: DAPO's dynamic sampling: draw tasks_per_round more tasks until a round holds
    max_draws: int = 3            # this many groups with a spread of reward (at most max_draws draws); train on them
    lr: float = 1e-5
    # 2 passes in batches of 4: about 20 optimizer steps a round where 1 pass of 16 made 3 (2026-12-04, seed 0, the
    # same SFT score: final - SFT sampled +0.073 [+0.016, +0.135] against +0.021 [-0.036, +0.083]; README)
    epochs: int = 2               # passes over a round's samples
    batch_size: int | None = 4    # samples per optimizer step (None: the round's whole shard in one step)
    loss_agg: str = "seq-mean-token-mean"  # veRL's loss_agg_mode: every sample weighs the same
    clip_low: float = 0.2
    clip_high: float = 0.28       # DAPO's clip-higher
    negative_weight: float = 1.0  # scale of negative advantages (1: GRPO; 0: only the better-than-average pull)
    norm_by_std: bool = True      # GRPO's advantage; False: Dr. GRPO (mean-centred only)
    call_cost: float = 0.0        # efficiency shaping: a success of n calls counts (1 - call_cost)**(n-1)
    success_only: bool = False    # advantages from success (reward 1) or not, not from the verifier's partial credit
    keep_optimizer: bool = True   # one AdamW for the GRPO rounds: new at round 1, its moments kept from round to round
    lora_rank: int = 0            # > 0: a rank-r adapter per round, merged (then no optimizer state carries over)
    train_layers: int = 0         # > 0: only the last K decoder blocks train (the backward pass stops below them)
    sft_anchor: float = 1.0       # > 0: the demonstrations' SFT loss times this joins every GRPO step (PPO-ptx):
    # without it lr 1e-5 broke the tool-call format (seed 1: unparsed calls 0.00 -> 0.25 a rollout)
    anchor_batch_size: int = 2    # demonstrations in each GRPO step's anchor loss (each costs one SFT sample pass)
    kl_coef: float = 0.0          # > 0: veRL's KL loss (k3) to the SFT version the rounds start from, times this:
    # the anchor holds the demonstrations' tokens, this the policy's own sampled ones (a reference forward a sample)
    precision: str = "auto"       # bf16 only where the CPU has native bfloat16 (60x slower emulated on AVX2)

    def check(self) -> None:
        if self.rounds < 0:
            raise RecipeError(f"--rounds {self.rounds}: pass 0 (SFT only) or more")
        if self.group_size < 2:
            raise RecipeError(f"--group-size {self.group_size}: a GRPO group needs at least 2 rollouts to compare; "
                              "pass --group-size 2 or more")
        for name in ("tasks_per_round", "epochs"):
            if getattr(self, name) < 1:
                raise RecipeError(f"--{name.replace('_', '-')} {getattr(self, name)}: pass 1 or more")
        if self.signal_groups < 0 or self.max_draws < 1:
            raise RecipeError(f"--signal-groups {self.signal_groups} / --max-draws {self.max_draws}: pass 0 (one draw "
                              "a round) or the number of groups with a spread of reward a round trains on, and 1 or "
                              "more draws of --tasks-per-round tasks to find them in, e.g. 8 and 3")
        if self.batch_size is not None and self.batch_size < 1:
            raise RecipeError(f"--grpo-batch-size {self.batch_size}: pass 1 or more (or leave it out: one step)")
        if not self.lr > 0:
            raise RecipeError(f"--grpo-lr {self.lr}: a learning rate is a positive number, e.g. 5e-6")
        if self.temperature < 0:
            raise RecipeError(f"--temperature {self.temperature}: sampling temperature is 0 or more")
        if self.loss_agg not in LOSS_AGG_MODES:
            raise RecipeError(f"--loss-agg {self.loss_agg!r}: one of {', '.join(LOSS_AGG_MODES)}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise RecipeError(f"--clip-low {self.clip_low} / --clip-high {self.clip_high}: the PPO clip range is "
                              "[1 - low, 1 + high] with 0 <= low < 1 and high >= 0, e.g. 0.2 / 0.28")
        if not 0 <= self.negative_weight <= 1:
            raise RecipeError(f"--negative-weight {self.negative_weight}: a scale of negative advantages in [0, 1] "
                              "(1: GRPO, 0: positive advantages only)")
        if not 0 <= self.call_cost < 1:
            raise RecipeError(f"--call-cost {self.call_cost}: the share of the reward each model call after the "
                              "first costs, in [0, 1) (0: the verifier's reward as it is; e.g. 0.1)")
        if self.sft_anchor < 0:
            raise RecipeError(f"--sft-anchor {self.sft_anchor}: the weight of the demonstrations' SFT loss in each "
                              "GRPO step is 0 (none) or more, e.g. 0.5")
        if self.anchor_batch_size < 1:
            raise RecipeError(f"--anchor-batch-size {self.anchor_batch_size}: the demonstrations in each GRPO step's "
                              "anchor loss; pass 1 or more, e.g. 2")
        if self.kl_coef < 0:
            raise RecipeError(f"--kl-coef {self.kl_coef}: the weight of the KL term to the SFT version is 0 (none) or "
                              "a positive number, e.g. 0.001 (veRL's GRPO examples) to 0.1")
        if self.lora_rank < 0:
            raise RecipeError(f"--lora-rank {self.lora_rank}: pass 0 (full fine-tune) or a rank of 1 or more")
        if self.train_layers < 0 or (self.train_layers and self.lora_rank):
            raise RecipeError(f"--train-layers {self.train_layers} (with --lora-rank {self.lora_rank}): pass 0 (every "
                              "weight) or the number of last decoder blocks to train, and not with a LoRA rank")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise RecipeError(f"--precision {self.precision!r}: auto, bf16 or fp32")

    def train_options(self) -> dict:
        """``learner.train``'s keywords for one round's update (the optimizer state file is the loop's)."""
        return {"lr": self.lr, "epochs": self.epochs, "batch_size": self.batch_size, "loss_agg": self.loss_agg,
                "clip_low": self.clip_low, "clip_high": self.clip_high,
                "negative_weight": self.negative_weight, "precision": self.precision,
                "lora_rank": self.lora_rank or None, "train_layers": self.train_layers or None}

    @property
    def carries_optimizer(self) -> bool:
        """One AdamW across the rounds (a LoRA round trains a new adapter: nothing to carry)."""
        return self.keep_optimizer and not self.lora_rank

    def as_dict(self) -> dict:
        return asdict(self)
