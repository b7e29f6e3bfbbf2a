"""Next-token log-probabilities and entropies from a causal LM's logits.

Position ``t`` of the logits predicts token ``t+1``, so ``[B, L]`` ids give ``[B, L-1]`` values: entry
``t`` belongs to ``input_ids[:, t+1]``. Logits are divided by the sampling temperature first, so the
trainer scores tokens under the same distribution the engine sampled from (``softmax(z / tau)``).
"""

from __future__ import annotations

import torch


def _check(logits: torch.Tensor, temperature: float) -> None:
    if logits.ndim != 3:
        raise ValueError(f"logits must be [B, L, V], got {tuple(logits.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (it divides the logits); pass the sampling one")


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(z_t / tau)[x_{t+1}]`` for every position: [B, L, V], [B, L] -> [B, L-1] float32.

    Computed as ``z[x] - logsumexp(z)`` rather than a full ``log_softmax``, which would keep a second
    [B, L, V] tensor alive for backward (the vocabulary dimension dominates memory).
    """
    _check(logits, temperature)
    if input_ids.shape != logits.shape[:2]:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} must match logits' [B, L] {tuple(logits.shape[:2])}")
    return target_logprobs(logits[:, :-1], input_ids[:, 1:], temperature)


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(z_k / tau)[target_k]`` with logits already aligned to their targets (no shift):
    [R, K, V], [R, K] -> [R, K] float32. The packed forward scores arbitrary (position, token) entries."""
    _check(logits, temperature)
    z = logits.float() / temperature  # [R, K, V]
    return z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of the next-token distribution, ``H = logsumexp(z) - sum_v p_v z_v``: [B, L, V] -> [B, L-1].

    A monitoring statistic (no gradient): a collapsing entropy is the usual first sign of a policy that
    stopped exploring.
    """
    return logits_entropy(logits[:, :-1], temperature)


@torch.no_grad()
def logits_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``token_entropy`` of logits already aligned (no shift): [R, K, V] -> [R, K]."""
    _check(logits, temperature)
    z = logits.float() / temperature
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)
