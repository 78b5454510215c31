"""Off-policy weights for a veRL shard: per-token ``rollout_is_weights`` from a re-score, as veRL 0.9.1's rollout
correction (``verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_weights``) defines them.

The log-ratio of a policy token is ``old - rollout``: the trainer's logprob (a re-score of the call under the
version the trainer starts from, ``openforge rescore``) minus the engine's that sampled it. Modes:

* ``token-tis``: per-token truncated importance sampling, ``min(exp(lr), cap)`` (veRL ``rollout_is="token"``,
  ``rollout_is_threshold=cap``);
* ``sequence-tis``: one weight per sample (a segment), ``min(exp(sum lr), cap)`` (``rollout_is="sequence"``);
* ``token-mis`` / ``sequence-mis``: masked importance sampling: the (token or sequence) ratio where it lies in
  [1/cap, cap], 0 where it does not (veRL's ``rollout_is_threshold="LOWER_UPPER"``, its "IcePop" masking, with
  LOWER = 1/cap).

Log-ratios (a sequence's sum) are clamped to [-20, 20] before ``exp`` (veRL's ``SAFETY_BOUND``); positions outside
the response mask get 0. veRL's batch normalisation (``rollout_is_batch_normalize``) is not applied: it depends on
the trainer's batch, which an export does not know.

Self-contained (the standard library only): ``learner/verl_check.py`` loads it by path in veRL's own venv to check
it against veRL's function on the same logprobs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

SAFETY_BOUND = 20.0
MODES = {"token-tis": "token", "sequence-tis": "sequence", "token-mis": "token", "sequence-mis": "sequence"}


def check(mode: str, cap: float) -> None:
    if mode not in MODES:
        raise ValueError(f"--rollout-is {mode!r} unknown: use one of {', '.join(MODES)}")
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 1 < cap < math.inf:
        raise ValueError(f"--rollout-is-cap {cap!r}: the cap of the importance weights must be a number above 1 "
                         "(veRL's rollout_is_threshold; 2.0 is its default)")


def verl_settings(mode: str, cap: float) -> dict:
    """The veRL ``algorithm.rollout_correction`` settings that compute the same weights."""
    check(mode, cap)
    threshold = f"{1 / cap!r}_{float(cap)!r}" if mode.endswith("mis") else float(cap)
    return {"rollout_is": MODES[mode], "rollout_is_threshold": threshold, "rollout_is_batch_normalize": False}


def _clamp(x: float) -> float:
    return max(-SAFETY_BOUND, min(SAFETY_BOUND, x))


def rollout_is_weights(old: Sequence[float], rollout: Sequence[float], mask: Sequence[int], mode: str,
                       cap: float) -> list[float]:
    """The weights of one sample's response positions (0 where ``mask`` is 0)."""
    check(mode, cap)
    if not len(old) == len(rollout) == len(mask):
        raise ValueError(f"{len(old)} trainer logprobs, {len(rollout)} engine logprobs and {len(mask)} mask values: "
                         "one of each per response position")
    masked = mode.endswith("mis")
    lower = 1 / cap

    def weight(log_ratio: float) -> float:
        w = math.exp(_clamp(log_ratio))
        if masked:
            return w if lower <= w <= cap else 0.0
        return min(w, cap)

    if MODES[mode] == "token":
        return [weight(o - r) if m else 0.0 for o, r, m in zip(old, rollout, mask)]
    seq = weight(sum(o - r for o, r, m in zip(old, rollout, mask) if m))
    return [seq if m else 0.0 for m in mask]
