"""Policy losses: per-token tensors in, per-token losses and scalar stats out.

Shapes: ``[B, T]`` is batch x token positions (the trainer passes next-token positions, ``T = L-1``),
``loss_mask[B, T]`` is 1 on completion tokens. Every function is pure and returns *per-token* losses,
zero off the mask; turning them into one scalar is a separate, registered choice (``LOSS_AGG`` in
``aggregation``) because it must be made over the whole step, across micro-batches and data-parallel ranks.

- ``POLICY_LOSSES``: ``fn(logprobs, old_logprobs, advantages, loss_mask, **hyper, behaviour_logprobs=None,
  is_cap=2.0, is_level="token") -> (loss[B, T], stats)``. ``advantages`` is [B] (one per sequence,
  broadcast over its tokens) or [B, T] (per token, e.g. GAE). ``hyper``: ``ppo_clip``: clip_eps;
  ``dual_clip``: clip_eps, dual_clip_c, clip_eps_high; ``clip_higher`` and ``gspo``: clip_eps, clip_eps_high.
  Stats always hold clip_frac, approx_kl, ratio_mean, ratio_max (masked-token means / max).

The other registries live beside their math: ``KL_ESTIMATORS`` in ``kl``, ``LOSS_AGG`` in ``aggregation``;
the critic's ``value_loss`` in ``value``. They are re-exported here, where the trainer imports them from.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from relayrl.algorithms.aggregation import (
    LOSS_AGG,
    Stats,
    agg_seq_mean_token_mean,
    agg_seq_mean_token_sum,
    agg_seq_mean_token_sum_norm,
    agg_token_mean,
    aggregate_loss,
    check_same_shape,
    masked_max,
    masked_mean,
    masked_token_sum,
)
from relayrl.algorithms.kl import KL_ESTIMATORS, kl_abs, kl_k1, kl_k2, kl_k3, kl_loss, kl_penalized_rewards
from relayrl.algorithms.value import value_loss


# ---------------------------------------------------------------------------------------- helpers
def _token_advantages(advantages: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """[B] -> [B, 1] (one per sequence, broadcast over tokens) or [B, T] as is."""
    if advantages.shape == shape[:1]:
        return advantages.unsqueeze(1).to(dtype)
    if advantages.shape == shape:
        return advantages.to(dtype)
    raise ValueError(
        f"advantages {tuple(advantages.shape)} must be [B]={shape[0]} (one per sequence) or "
        f"[B, T]={tuple(shape)} (one per token)"
    )


# ---------------------------------------------------------------------------------------- off-policy
def truncated_is_weights(
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    cap: float = 2.0,
    level: str = "token",
) -> torch.Tensor:
    """Truncated importance weights ``w = min(pi_old / mu, C)`` correcting for the behaviour policy ``mu``.

        token:    w_t = min(exp(old_t - mu_t), C)
        sequence: w   = min(exp(sum_t (old_t - mu_t)), C)      the same weight on every token of the row

    In async training the tokens were sampled by an engine whose weights (``mu``, its reported logprobs)
    lag the trainer's ``pi_old``; PPO's ratio ``pi / pi_old`` then measures only the trust region, and ``w``
    restores the expectation under ``mu`` (decoupled PPO: Hilton et al. 2021, arXiv:2110.00641; AReaL, Fu
    et al. 2025, arXiv:2505.24298). Truncation at ``C`` bounds the variance at the price of a small bias
    (IMPALA's rho-bar, Espeholt et al. 2018, arXiv:1802.01561). Sequence level is the exact weight of the
    whole sample but its variance grows with length. Computed in log space (no overflow); no gradient.
    Returns [B, T], zero off the mask.
    """
    check_same_shape(loss_mask, old_logprobs=old_logprobs, behaviour_logprobs=behaviour_logprobs)
    if cap <= 0:
        raise ValueError(f"is_cap={cap} must be > 0; 2.0 is common (C in w = min(pi_old / mu, C))")
    mask = loss_mask.bool()
    log_w = torch.where(mask, old_logprobs - behaviour_logprobs, torch.zeros_like(old_logprobs)).detach()
    if level == "sequence":
        log_w = log_w.sum(dim=1, keepdim=True).expand_as(log_w)
    elif level != "token":
        raise ValueError(f"is_level={level!r} is not known; use 'token' or 'sequence'")
    w = torch.exp(torch.clamp(log_w, max=math.log(cap)))
    return torch.where(mask, w, torch.zeros_like(w))


# ---------------------------------------------------------------------------------------- policy losses
def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, dual_clip_c: float | None
) -> tuple[torch.Tensor, Stats]:
    """``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``, bounded by ``-c A`` for ``A < 0`` if dual-clipped."""
    loss = -torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)
    with torch.no_grad():
        flags = {"clip": ((adv > 0) & (ratio > 1.0 + eps_high)) | ((adv < 0) & (ratio < 1.0 - eps_low))}
    if dual_clip_c is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip_c * adv), loss)
        flags["dual_clip"] = ((adv < 0) & (ratio > dual_clip_c)).detach()
    return loss, flags


def _policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None = None,
    sequence_ratio: bool = False,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float = 2.0,
    is_level: str = "token",
) -> tuple[torch.Tensor, Stats]:
    """Shared body of every ``POLICY_LOSSES`` entry: ratio, clipped surrogate, optional IS weight, stats."""
    check_same_shape(loss_mask, logprobs=logprobs, old_logprobs=old_logprobs)
    if eps_low <= 0 or eps_high <= 0:
        raise ValueError(f"clip_eps={eps_low} and clip_eps_high={eps_high} must be > 0; PPO uses 0.2")
    mask = loss_mask.bool()
    # Zero log-ratio off the mask: padding positions then can't overflow exp() and poison gradients.
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    if sequence_ratio:  # GSPO-token: value exp(mean_t log-ratio), gradient d/dlogprob_t = that value
        seq = log_ratio.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
        log_ratio = torch.where(mask, logprobs - logprobs.detach(), torch.zeros_like(logprobs)) + seq.detach()
    ratio = torch.exp(log_ratio)
    loss, flags = _clipped_surrogate(
        ratio, _token_advantages(advantages, ratio.shape, ratio.dtype), eps_low, eps_high, dual_clip_c
    )
    stats: Stats = {}
    if behaviour_logprobs is not None:
        w = truncated_is_weights(old_logprobs, behaviour_logprobs, loss_mask, is_cap, is_level)
        loss = loss * w
        truncated = (w >= is_cap * (1 - 1e-6)).to(w.dtype)
        stats.update(is_weight_mean=masked_mean(w, mask), is_trunc_frac=masked_mean(truncated, mask))
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    with torch.no_grad():
        stats.update(
            clip_frac=masked_mean(flags["clip"].to(ratio.dtype), mask),
            approx_kl=masked_mean(kl_k3(old_logprobs, logprobs), mask),
            ratio_mean=masked_mean(ratio, mask),
            ratio_max=masked_max(ratio, mask),
        )
        if "dual_clip" in flags:
            stats["dual_clip_frac"] = masked_mean(flags["dual_clip"].to(ratio.dtype), mask)
    return loss, stats


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float = 0.2,
    *,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float = 2.0,
    is_level: str = "token",
) -> tuple[torch.Tensor, Stats]:
    """PPO's clipped surrogate, per token (Schulman et al. 2017, arXiv:1707.06347, eq. 7), negated to a loss.

        ratio = exp(logprobs - old_logprobs)
        loss  = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)          (* w if behaviour_logprobs)

    Where the clipped term is the minimum (A > 0 and ratio > 1+eps, or A < 0 and ratio < 1-eps) the loss
    is constant in ``logprobs``, so those tokens get no gradient: the update stops pushing a token that has
    already moved far enough. ``w`` is ``truncated_is_weights(old, behaviour, ...)`` for off-policy data.

    logprobs, old_logprobs, loss_mask: [B, T]; advantages: [B] or [B, T]. Returns (loss [B, T], zero off
    the mask; stats over masked tokens: clip_frac, approx_kl = mean k3 of KL(pi_old || pi), ratio_mean,
    ratio_max, and is_weight_mean, is_trunc_frac when behaviour_logprobs is given).
    """
    return _policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        clip_eps,
        clip_eps,
        behaviour_logprobs=behaviour_logprobs,
        is_cap=is_cap,
        is_level=is_level,
    )


def dual_clip_ppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float = 0.2,
    dual_clip_c: float = 3.0,
    clip_eps_high: float | None = None,
    *,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float = 2.0,
    is_level: str = "token",
) -> tuple[torch.Tensor, Stats]:
    """Dual-clip PPO (Ye et al. 2020, *Mastering Complex Control in MOBA Games*, arXiv:1912.09729).

        loss = -min(r A, clip(r, 1 - eps, 1 + eps_high) A)              A >= 0
        loss = min(-min(r A, clip(r, ...) A), -c A)  <=  c |A|          A <  0

    With A < 0 PPO's loss ``-r A = r |A|`` grows without bound in the ratio: one token that became far
    more likely than under pi_old (off-policy data, a stale sample) can dominate the step. The second clip
    caps it at ``c |A|`` (c = 3 in the paper) and gives ratios above c no gradient. ``clip_eps_high``
    defaults to ``clip_eps``. Shapes, stats and the IS hook as ``ppo_clip_loss``; stats add dual_clip_frac.
    """
    if dual_clip_c <= 1.0:
        raise ValueError(
            f"dual_clip_c={dual_clip_c} must be > 1 (it caps the loss at c|A| for A < 0); the paper uses 3"
        )
    return _policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        clip_eps,
        clip_eps if clip_eps_high is None else clip_eps_high,
        dual_clip_c=dual_clip_c,
        behaviour_logprobs=behaviour_logprobs,
        is_cap=is_cap,
        is_level=is_level,
    )


def clip_higher_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float = 0.28,
    *,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float = 2.0,
    is_level: str = "token",
) -> tuple[torch.Tensor, Stats]:
    """DAPO's clip-higher: ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`` with eps_high > eps_low.

    Yu et al. 2025, *DAPO*, arXiv:2503.14476, sec. 3.1 (eps_low = 0.2, eps_high = 0.28). A symmetric clip
    lets a likely token (p = 0.9) rise to 1 but an unlikely one (p = 0.01) only to 0.012, so exploration
    tokens can barely gain mass and entropy collapses; a higher upper bound leaves them room. Shapes,
    stats and the IS hook as ``ppo_clip_loss``.
    """
    return _policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        clip_eps,
        clip_eps_high,
        behaviour_logprobs=behaviour_logprobs,
        is_cap=is_cap,
        is_level=is_level,
    )


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float = 3e-4,
    clip_eps_high: float = 4e-4,
    *,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float = 2.0,
    is_level: str = "token",
) -> tuple[torch.Tensor, Stats]:
    """GSPO: the ratio and its clip at sequence level (Zheng et al. 2025, arXiv:2507.18071).

        s_i     = (pi(y_i) / pi_old(y_i))^(1/|y_i|) = exp(mean_t (logprobs - old_logprobs))
        s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]          (GSPO-token: value s_i, d/dlogprob_t = s_i)
        loss_t  = -min(s_{i,t} A_t, clip(s_{i,t}, 1 - eps_low, 1 + eps_high) A_t)

    Token ratios are noisy single-sample weights; one ratio per sequence matches the sequence-level reward
    and keeps MoE training stable. With [B] advantages and ``seq-mean-token-mean`` aggregation the gradient
    is exactly GSPO's ``-(1/|y_i|) s_i A_i sum_t grad logprob_t`` per sequence; the clip range is tiny
    (3e-4, 4e-4 in the paper) because s_i is a per-token geometric mean. Clipping zeroes a whole
    sequence's gradient. Shapes, stats and the IS hook as ``ppo_clip_loss``.
    """
    return _policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        clip_eps,
        clip_eps_high,
        sequence_ratio=True,
        behaviour_logprobs=behaviour_logprobs,
        is_cap=is_cap,
        is_level=is_level,
    )


PolicyLossFn = Callable[..., tuple[torch.Tensor, Stats]]

POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "ppo_clip": ppo_clip_loss,
    "dual_clip": dual_clip_ppo_loss,
    "clip_higher": clip_higher_loss,
    "gspo": gspo_loss,
}
"""Policy losses by name: ``fn(logprobs, old_logprobs, advantages, loss_mask, **hyper) -> (loss[B, T], stats)``."""


# ---------------------------------------------------------------------------------------- entropy
def entropy_bonus(entropy: torch.Tensor, loss_mask: torch.Tensor, coef: float) -> tuple[torch.Tensor, Stats]:
    """Entropy bonus ``-coef * H_t`` per token, ``H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_{t,v}``.

    Adding it to the loss rewards a flatter next-token distribution (PPO, arXiv:1707.06347, eq. 9), the
    usual guard against entropy collapse. ``entropy`` [B, T]: H_t at the sampling temperature, aligned with
    ``loss_mask`` [B, T] and differentiable (the trainer's chunked head, ``trainer/head.py``, gives it
    without holding [B, T, V] logits). Returns (loss [B, T] zero off the mask, {"entropy": masked mean}).
    """
    if entropy.shape != loss_mask.shape:
        raise ValueError(
            f"entropy {tuple(entropy.shape)} must be [B, T] = loss_mask {tuple(loss_mask.shape)}; "
            "align it with the scored positions first"
        )
    mask = loss_mask.bool()
    loss = torch.where(mask, -coef * entropy.float(), torch.zeros_like(entropy, dtype=torch.float32))
    return loss, {"entropy": masked_mean(entropy.detach().float(), mask)}


__all__ = [
    "KL_ESTIMATORS",
    "LOSS_AGG",
    "POLICY_LOSSES",
    "agg_seq_mean_token_mean",
    "agg_seq_mean_token_sum",
    "agg_seq_mean_token_sum_norm",
    "agg_token_mean",
    "aggregate_loss",
    "clip_higher_loss",
    "dual_clip_ppo_loss",
    "entropy_bonus",
    "gspo_loss",
    "kl_abs",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_loss",
    "kl_penalized_rewards",
    "masked_token_sum",
    "ppo_clip_loss",
    "truncated_is_weights",
    "value_loss",
]
