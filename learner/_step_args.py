"""The train step's command line (``learner/train_step.py``): its options, defaults and the refusals of combinations
that cannot train. Imports nothing outside the standard library (the step runs by path in the engine's environment).
"""

from __future__ import annotations

import argparse

try:
    from ._step_losses import KL_TYPES, LOSS_AGG_MODES
except ImportError:   # run by path (python learner/train_step.py): its folder is on sys.path
    from _step_losses import KL_TYPES, LOSS_AGG_MODES

DESCRIPTION = ("Policy updates of a Hugging Face causal LM on the CPU: GRPO from a veRL shard's samples, or SFT from "
               "an SFT shard's conversations.")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=DESCRIPTION)
    ap.add_argument("--algorithm", choices=("grpo", "sft"), default="grpo")
    ap.add_argument("--samples", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lr", type=float, default=None, help="default: 1e-5 (grpo), 1e-4 (sft)")
    ap.add_argument("--epochs", type=int, default=None, help="passes over the samples; default: 1 (grpo), 3 (sft)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (instead of --epochs)")
    ap.add_argument("--batch-size", type=int, default=None, help="default: the whole shard (grpo), 8 (sft)")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop after the step that spends this much "
                    "training time (the steps of --epochs / --steps are the most it takes)")
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                    help="bf16: the transformer under bfloat16 autocast (float32 weights, optimizer and output "
                    "layer), about 2x faster on a CPU with native bfloat16 (AVX-512 BF16 / AMX) and about 60x "
                    "SLOWER on one without (an AVX2-only CPU emulates it); fp32: float32 throughout; auto (the "
                    "default): bf16 where oneDNN has native bfloat16, else fp32")
    ap.add_argument("--optimizer-state", default=None, help="AdamW's state: resumed from this file when it exists, "
                    "written there after the update")
    ap.add_argument("--loss-agg", choices=LOSS_AGG_MODES, default="token-mean", help="veRL's loss_agg_mode (grpo)")
    ap.add_argument("--clip", type=float, default=None, help="sets --clip-low and --clip-high")
    ap.add_argument("--clip-low", type=float, default=0.2)
    ap.add_argument("--clip-high", type=float, default=0.2)
    ap.add_argument("--clip-c", type=float, default=3.0, help="dual-clip bound for negative advantages (veRL: 3)")
    ap.add_argument("--negative-weight", type=float, default=1.0,
                    help="scale of negative advantages (1: GRPO; 0: only better-than-average samples train)")
    ap.add_argument("--keep-zero-advantage", dest="drop_zero_advantage", action="store_false",
                    help="compute zero-advantage samples too (their gradient is zero; they only enlarge "
                    "token-mean's denominator)")
    ap.add_argument("--lora-rank", type=int, default=0, help="train a rank-r adapter on every attention and MLP "
                    "projection, merged into the weights at the end (0: every weight, the default)")
    ap.add_argument("--lora-alpha", type=float, default=32.0, help="the adapter's scale is alpha / rank")
    ap.add_argument("--train-layers", type=int, default=0, help="train only the last K decoder blocks and the final "
                    "norm, the rest frozen (the backward pass stops below them: about 2x faster with 10 of 30, and "
                    "slower to learn, see learner/_freeze.py); 0: every weight, the default")
    ap.add_argument("--anchor-samples", default=None, help="grpo: SFT conversations (JSON lines of messages, "
                    "tools) whose assistant loss, times --anchor-coef, joins every GRPO step (InstructGPT's PPO-ptx: "
                    "the policy stays near its demonstrations while the policy gradient moves it)")
    ap.add_argument("--anchor-coef", type=float, default=0.0, help="weight of the anchor's SFT loss (e.g. 0.5)")
    ap.add_argument("--anchor-batch-size", type=int, default=8, help="anchor conversations per GRPO step")
    ap.add_argument("--ref", default=None, help="grpo: the reference checkpoint folder (e.g. the SFT version the "
                    "GRPO chain started from) whose log-probabilities of the sampled tokens the KL term compares with")
    ap.add_argument("--kl-coef", type=float, default=0.0, help="grpo: weight of the KL(policy || --ref) term in "
                    "the loss (veRL's use_kl_loss with kl_loss_coef; its GRPO examples use 0.001); 0: none")
    ap.add_argument("--kl-type", choices=KL_TYPES, default="low_var_kl", help="veRL's kl_loss_type (low_var_kl = k3)")
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sft = args.algorithm == "sft"
    args.lr = args.lr if args.lr is not None else (1e-4 if sft else 1e-5)
    args.epochs = args.epochs if args.epochs is not None else (3 if sft else 1)
    if args.clip is not None:
        args.clip_low = args.clip_high = args.clip
    for name in ("epochs", "steps", "batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: pass 1 or more")
    if args.max_seconds is not None and args.max_seconds <= 0:
        ap.error(f"--max-seconds {args.max_seconds}: pass a positive number of seconds")
    if not 0 <= args.negative_weight <= 1:
        ap.error(f"--negative-weight {args.negative_weight}: a scale of negative advantages in [0, 1] (1: GRPO)")
    if args.anchor_samples and (sft or not args.anchor_coef > 0 or args.anchor_batch_size < 1):
        ap.error(f"--anchor-samples with --algorithm {args.algorithm}, --anchor-coef {args.anchor_coef}, "
                 f"--anchor-batch-size {args.anchor_batch_size}: an anchor joins GRPO steps only, with a positive "
                 "weight and 1 or more conversations a step (e.g. --anchor-coef 0.5 --anchor-batch-size 8)")
    if args.kl_coef < 0 or bool(args.ref) != (args.kl_coef > 0) or (args.ref and sft):
        ap.error(f"--ref {args.ref} with --kl-coef {args.kl_coef} and --algorithm {args.algorithm}: a KL term "
                 "belongs to GRPO updates and needs both a reference checkpoint and a positive weight (e.g. --ref "
                 "SFT_DIR --kl-coef 0.001), or neither")
    if args.lora_rank < 0:
        ap.error(f"--lora-rank {args.lora_rank}: pass 0 (every weight) or a rank of 1 or more")
    if args.lora_rank and args.train_layers:
        ap.error("--lora-rank with --train-layers: the adapters wrap every block, so nothing is cut from the backward "
                 "pass; leave one of them out")
    if args.lora_rank and args.optimizer_state:
        ap.error("--lora-rank with --optimizer-state: each LoRA update trains a new adapter and merges it, so no "
                 "optimizer state carries over; leave one of them out")
    return args
