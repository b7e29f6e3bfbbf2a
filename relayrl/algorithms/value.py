"""The critic's loss: PPO's clipped value loss, per token, aggregated like policy losses (``LOSS_AGG``)."""

from __future__ import annotations

import torch

from relayrl.algorithms.aggregation import Stats, check_same_shape, masked_mean


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float | None = 0.2
) -> tuple[torch.Tensor, Stats]:
    """PPO critic loss with value clipping (the PPO2 baseline implementation; Engstrom et al. 2020,
    *Implementation Matters*, arXiv:2005.12729), per token:

        V_clip = V_old + clip(V - V_old, -c, c)
        loss   = 0.5 * max((V - R)^2, (V_clip - R)^2)

    The max makes the loss pessimistic: once V has moved more than ``c`` from ``V_old`` towards ``R`` the
    clipped term dominates and is constant in V, so the critic can't jump on one batch (the trust region
    of the policy clip, for the value). ``clip=None`` or 0 gives plain ``0.5 (V - R)^2``. Returns (loss
    [B, T] zero off the mask, stats: vf_clip_frac (tokens where the clipped term is larger), value_mean,
    return_mean, explained_var = 1 - Var(R - V) / Var(R)). Aggregate with ``LOSS_AGG`` like policy losses.
    """
    check_same_shape(mask, values=values, old_values=old_values, returns=returns)
    m = mask.bool()
    unclipped = (values - returns) ** 2
    if clip:
        clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (clipped_values - returns) ** 2
        loss = 0.5 * torch.maximum(unclipped, clipped)
        clip_frac = masked_mean((clipped > unclipped).to(values.dtype), m)
    else:
        loss, clip_frac = 0.5 * unclipped, values.new_zeros(())
    with torch.no_grad():
        ret_var = masked_mean((returns - masked_mean(returns, m)) ** 2, m)
        err = returns - values
        err_var = masked_mean((err - masked_mean(err, m)) ** 2, m)
        stats = {
            "vf_clip_frac": clip_frac.detach(),
            "value_mean": masked_mean(values.detach(), m),
            "return_mean": masked_mean(returns, m),
            "explained_var": 1.0 - err_var.detach() / ret_var.clamp(min=1e-8),
        }
    return torch.where(m, loss, torch.zeros_like(loss)), stats
