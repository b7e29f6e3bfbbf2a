"""Policy-gradient losses: per-token tensors in, per-token losses and scalar stats out.

Shapes: ``[B, T]`` is batch x token positions (the trainer passes next-token positions, ``T = L-1``),
``loss_mask[B, T]`` is 1 on completion tokens. Every function is pure; aggregation across micro-batches
and ranks is the caller's job (``masked_token_sum`` gives the numerator, the caller the token count).
"""

from __future__ import annotations

import torch


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref) per token, for tokens sampled from pi.

    With ``d = log pi_ref(x) - log pi(x)``: ``k3 = exp(d) - d - 1`` (J. Schulman, "Approximating KL
    Divergence", 2020, http://joschu.net/blog/kl-approx.html). It is unbiased (E_pi[exp(d)] = 1), and
    never negative (e^d >= 1 + d), unlike k1 = -d. GRPO uses it as its KL penalty (DeepSeekMath eq. 4).
    Shapes: [B, T] -> [B, T].
    """
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1.0


def masked_token_sum(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values[B, T]`` over positions where ``loss_mask`` is set; a scalar.

    The trainer divides this by the number of completion tokens in the *whole step* (all micro-batches,
    all ranks), giving the token-level mean of DAPO (Yu et al. 2025, arXiv:2503.14476, sec. 3.3) and
    Dr.GRPO: every token weighs the same, whatever the length of its sequence or how the batch was split.
    """
    return torch.where(loss_mask.bool(), values, torch.zeros_like(values)).sum()


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_token_sum(values, mask) / mask.sum().clamp(min=1)


def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  loss_mask: torch.Tensor, clip_eps: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate, per token (Schulman et al. 2017, arXiv:1707.06347, eq. 7), negated to a loss.

        ratio = exp(logprobs - old_logprobs)
        loss  = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)

    ``A`` is the sequence's advantage broadcast over its tokens (GRPO). Where the clipped term is the
    minimum (A > 0 and ratio > 1+eps, or A < 0 and ratio < 1-eps) the loss is constant in ``logprobs``,
    so those tokens get no gradient: the update stops pushing a token that has already moved far enough.

    logprobs, old_logprobs, loss_mask: [B, T]; advantages: [B]. Returns (loss [B, T], zero off the mask;
    stats over masked tokens: clip_frac, approx_kl = mean k3 of KL(pi_old || pi), ratio_mean, ratio_max).
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != loss_mask.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and "
                         f"loss_mask {tuple(loss_mask.shape)} must have the same [B, T] shape")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages {tuple(advantages.shape)} must be [B]={logprobs.shape[0]}, one per sequence")
    mask = loss_mask.bool()
    # Zero log-ratio off the mask: padding positions then can't overflow exp() and poison gradients.
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    adv = advantages.unsqueeze(1).to(ratio.dtype)                          # [B, 1]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    loss = torch.where(mask, -torch.minimum(unclipped, clipped), torch.zeros_like(ratio))
    with torch.no_grad():
        is_clipped = ((adv > 0) & (ratio > 1.0 + clip_eps)) | ((adv < 0) & (ratio < 1.0 - clip_eps))
        stats = {
            "clip_frac": _masked_mean(is_clipped.to(ratio.dtype), mask),
            "approx_kl": _masked_mean(kl_k3(old_logprobs, logprobs), mask),
            "ratio_mean": _masked_mean(ratio, mask),
            "ratio_max": torch.where(mask, ratio, torch.zeros_like(ratio)).max() if mask.any()
            else ratio.new_zeros(()),
        }
    return loss, stats
