"""How per-token losses become the step's one scalar, and the masked reductions every loss uses.

Shapes: ``[B, T]`` is batch x token positions, ``loss_mask[B, T]`` is 1 on completion tokens. The losses
(``losses``, ``kl``, ``value``) return *per-token* losses, zero off the mask; turning them into one scalar
is a separate, registered choice because it must be made over the whole step, across micro-batches and
data-parallel ranks:

- ``LOSS_AGG``: ``fn(loss[B, T], loss_mask[B, T], **kw) -> (numerator, denominator)``, both additive over
  micro-batches and ranks; the step's loss is ``sum(numerators) / sum(denominators)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Stats = dict[str, torch.Tensor]
"""A loss's scalar statistics by name (masked-token means / max), beside its per-token loss."""


# ---------------------------------------------------------------------------------------- masked reductions
def masked_token_sum(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values[B, T]`` over positions where ``loss_mask`` is set; a scalar.

    The trainer divides this by the number of completion tokens in the *whole step* (all micro-batches,
    all ranks), giving the token-level mean of DAPO (Yu et al. 2025, arXiv:2503.14476, sec. 3.3) and
    Dr.GRPO: every token weighs the same, whatever the length of its sequence or how the batch was split.
    """
    return torch.where(loss_mask.bool(), values, torch.zeros_like(values)).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_token_sum(values, mask) / mask.sum().clamp(min=1)


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.bool()
    return torch.where(m, values, torch.zeros_like(values)).max() if m.any() else values.new_zeros(())


def check_same_shape(loss_mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    if loss_mask.ndim != 2 or any(t.shape != loss_mask.shape for t in tensors.values()):
        shapes = ", ".join(f"{k} {tuple(t.shape)}" for k, t in tensors.items())
        raise ValueError(f"{shapes} and loss_mask {tuple(loss_mask.shape)} must have the same [B, T] shape")


# ---------------------------------------------------------------------------------------- aggregation
def _row_has_tokens(mask: torch.Tensor) -> torch.Tensor:
    return mask.bool().any(dim=1)


def agg_token_mean(loss: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """token-mean: ``sum_{i,t} l_{i,t} / sum_i |y_i|``; every token weighs the same (DAPO sec. 3.3).

    Micro-batching / data parallel: the denominator is the step's *total* token count over all
    micro-batches and ranks (all-reduce it before the first backward); averaging per-micro-batch means
    instead re-weights tokens by how the batch happened to be split.
    """
    return masked_token_sum(loss, loss_mask), loss_mask.bool().sum().to(loss.dtype)


def agg_seq_mean_token_sum(loss: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """seq-mean-token-sum: ``(1/B) sum_i sum_t l_{i,t}``; long sequences weigh more, with no length bias
    in the per-token gradient. Global denominator: the step's number of sequences (rows with at least one
    token; padding rows don't count), summed over micro-batches and ranks.
    """
    return masked_token_sum(loss, loss_mask), _row_has_tokens(loss_mask).sum().to(loss.dtype)


def agg_seq_mean_token_mean(loss: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """seq-mean-token-mean: ``(1/B) sum_i (1/|y_i|) sum_t l_{i,t}``, the original GRPO objective
    (DeepSeekMath eq. 3) and GSPO's. Each sequence weighs the same, so a token of a long answer weighs
    less: Dr.GRPO's length bias (long wrong answers are penalised less per token). A sequence is never
    split across micro-batches, so its inner mean is local; the global denominator is the step's number of
    sequences, as for seq-mean-token-sum.
    """
    m = loss_mask.bool()
    per_seq = torch.where(m, loss, torch.zeros_like(loss)).sum(1) / m.sum(1).clamp(min=1)
    return per_seq.sum(), _row_has_tokens(loss_mask).sum().to(loss.dtype)


def agg_seq_mean_token_sum_norm(
    loss: torch.Tensor, loss_mask: torch.Tensor, max_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr.GRPO's constant normaliser: ``sum_{i,t} l_{i,t} / (B * L)`` with ``L`` a constant (the generation
    budget, e.g. ``max_tokens``), not anything measured on the batch (Liu et al. 2025, arXiv:2503.20783,
    sec. 3.1). No length enters the weights, so the gradient is unbiased in length; the step size of
    the loss then scales with 1/L. Global denominator: ``L *`` the step's number of sequences.
    """
    if max_len <= 0:
        raise ValueError(f"max_len={max_len} must be > 0; pass the generation budget (rollout max_tokens)")
    return masked_token_sum(loss, loss_mask), _row_has_tokens(loss_mask).sum().to(loss.dtype) * max_len


LossAggFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]

LOSS_AGG: dict[str, LossAggFn] = {
    "token-mean": agg_token_mean,
    "seq-mean-token-sum": agg_seq_mean_token_sum,
    "seq-mean-token-mean": agg_seq_mean_token_mean,
    "seq-mean-token-sum-norm": agg_seq_mean_token_sum_norm,
}
"""Aggregation modes: ``fn(loss[B, T], loss_mask[B, T], **kw) -> (numerator, denominator)``; kw:
``seq-mean-token-sum-norm`` needs ``max_len``. Both parts are sums, so a step split into micro-batches
``k`` on ranks ``r`` has loss ``sum_{k,r} num_{k,r} / sum_{k,r} den_{k,r}``: all-reduce the denominators
(they depend only on masks, known before the forward pass), then back-propagate ``num_k / den_global``
per micro-batch (times world size where FSDP averages gradients over ranks)."""


def aggregate_loss(loss: torch.Tensor, loss_mask: torch.Tensor, mode: str = "token-mean", **kw: int) -> torch.Tensor:
    """One batch's scalar loss under ``LOSS_AGG[mode]``: ``numerator / denominator`` (0 if no tokens)."""
    if mode not in LOSS_AGG:
        raise ValueError(f"loss aggregation {mode!r} is not known; use one of {sorted(LOSS_AGG)}")
    num, den = LOSS_AGG[mode](loss, loss_mask, **kw)
    return num / torch.where(den > 0, den, torch.ones_like(den))
