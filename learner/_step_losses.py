"""The losses of the CPU train step, as veRL 0.9 defines them, over padded ``(batch, tokens)`` tensors.

``policy_loss`` is veRL's ``compute_policy_loss_vanilla`` (``get_policy_loss_fn("vanilla")``): the PPO-clip
surrogate with asymmetric clipping (``clip_low`` / ``clip_high``, DAPO's clip-higher when they differ), the dual
clip ``clip_c`` for negative advantages, the log-ratio clamped to [-20, 20], optional per-token
``rollout_is_weights``. ``agg_loss`` is veRL's ``agg_loss`` for one data-parallel rank: ``token-mean``, ``token-sum``,
``seq-mean-token-sum``, ``seq-mean-token-mean`` and ``seq-mean-token-sum-norm`` (Dr. GRPO). ``kl_penalty`` is
veRL's ``kl_penalty`` (the per-token estimate of KL(policy || reference) its actor adds to the policy loss, times
``kl_loss_coef``, when ``use_kl_loss`` is on: ``k1`` / ``kl``, ``abs``, ``k2`` / ``mse``, ``k3`` / ``low_var_kl``,
GRPO's choice). The micro-batch totals
(``batch_num_tokens``, ``global_batch_size``) are passed in, as veRL's ``global_batch_info`` does, so that a
mini-batch split into micro-batches sums to the loss of the whole mini-batch.

Written from veRL's definitions (not imported: veRL imports Ray and its trainer stack, which the engine's torch
environment does not carry); ``tests/slow/test_verl_crosscheck.py`` runs both on the same tensors in veRL's own
venv and requires equal losses and gradients for every mode.

Pure functions of torch tensors; ``torch`` is passed in so that this module imports nothing (the step script runs it
by path in another environment).
"""

from __future__ import annotations

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_TYPES = ("low_var_kl", "k3", "kl", "k1", "abs", "mse", "k2", "k3+", "low_var_kl+", "k1+", "kl+")


def masked_sum(torch, values, mask):
    return torch.sum(values * mask)


def agg_loss(torch, loss_mat, loss_mask, mode: str, *, batch_num_tokens=None, global_batch_size=None,
             loss_scale_factor=None):
    """Aggregate a ``(batch, tokens)`` loss matrix into a scalar, as veRL's ``agg_loss`` with ``dp_size=1``."""
    if mode == "token-mean":
        n = loss_mask.sum() if batch_num_tokens is None else batch_num_tokens
        return masked_sum(torch, loss_mat, loss_mask) / n
    if mode == "token-sum":
        return masked_sum(torch, loss_mat, loss_mask)
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        n = seq_mask.sum() if global_batch_size is None else global_batch_size
        loss = masked_sum(torch, seq_losses, seq_mask) / n
        if mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    if mode == "seq-mean-token-mean":
        counts = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (counts + 1e-8)
        seq_mask = (counts > 0).float()
        n = seq_mask.sum() if global_batch_size is None else global_batch_size
        return masked_sum(torch, seq_losses, seq_mask) / n
    raise ValueError(f"loss aggregation {mode!r}: use one of {', '.join(LOSS_AGG_MODES)}")


def policy_loss(torch, old_log_prob, log_prob, advantages, response_mask, *, mode: str = "token-mean",
                clip_low: float = 0.2, clip_high: float = 0.2, clip_c: float = 3.0, rollout_is_weights=None,
                **agg):
    """The PPO-clip policy loss of veRL's ``vanilla`` policy loss; returns (loss, metrics)."""
    if clip_c <= 1.0:
        raise ValueError(f"clip_c {clip_c}: the dual-clip bound must be greater than 1 (veRL's default is 3)")
    neg_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clipped = torch.maximum(losses1, losses2)
    losses3 = -advantages * clip_c
    dual = torch.minimum(losses3, clipped)
    losses = torch.where(advantages < 0, dual, clipped)
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    with torch.no_grad():
        n = response_mask.sum().clamp(min=1)
        metrics = {"clipfrac": float(torch.sum(torch.gt(losses2, losses1).float() * response_mask) / n),
                   "ppo_kl": float(torch.sum(-neg_kl * response_mask) / n)}
    return agg_loss(torch, losses, response_mask, mode, **agg), metrics


def kl_penalty(torch, log_prob, ref_log_prob, kind: str = "low_var_kl"):
    """Per-token estimate of KL(policy || reference) from the sampled tokens' log-probabilities, as veRL's
    ``kl_penalty``: ``k1`` is log p - log q; ``k2`` half its square; ``k3`` (``low_var_kl``, Schulman's unbiased,
    non-negative estimator) q/p - log(q/p) - 1, with the log-ratio clamped to [-20, 20] and the result to [-10, 10].
    A trailing ``+`` (``k3+``) keeps the value and takes k2's gradient (veRL's straight-through: k2's gradient is
    the unbiased one of KL)."""
    if kind.endswith("+") and kind[:-1] in KL_TYPES:
        value = kl_penalty(torch, log_prob, ref_log_prob, kind[:-1])
        k2 = 0.5 * (log_prob - ref_log_prob).square()
        return k2 - k2.detach() + value.detach()
    if kind in ("kl", "k1"):
        return log_prob - ref_log_prob
    if kind == "abs":
        return (log_prob - ref_log_prob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (log_prob - ref_log_prob).square()
    if kind in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_log_prob - log_prob, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10.0, max=10.0)
    raise ValueError(f"kl type {kind!r}: use one of {', '.join(KL_TYPES)}")
