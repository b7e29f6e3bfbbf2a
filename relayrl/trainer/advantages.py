"""Advantage estimators: rewards and group ids in, one advantage per sequence out.

GRPO (Shao et al. 2024, *DeepSeekMath*, arXiv:2402.03300, eq. 3 / sec. 4.1.2) replaces PPO's learned
value baseline with the other samples of the same prompt: each completion's advantage is its reward
relative to its group,

    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)          (GRPO)
    A_i =  r_i - mean_g(r)                              (Dr.GRPO, norm_std=False)

Dr.GRPO (Liu et al. 2025, *Understanding R1-Zero-Like Training*, arXiv:2503.20783, sec. 3.1) drops the
division by std because it up-weights prompts whose rewards barely vary (too easy or too hard), a
question-level difficulty bias.

``std_g`` is the *sample* standard deviation (Bessel-corrected, divisor G-1), the one DeepSeekMath's
reference implementation, TRL's ``GRPOTrainer`` and verl compute with ``torch.std``; using the same
estimator keeps advantage scales comparable across frameworks. A group of one has no baseline to compare
against and gets advantage 0. A group whose rewards are all equal also gets 0 (nothing to learn from).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, norm_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages ``(r - mean_g) / (std_g + eps)``; ``norm_std=False`` is Dr.GRPO.

    rewards: [N] float, group_ids: [N] int (any labels; equal label = same group). Returns [N] float32.
    """
    if rewards.ndim != 1 or rewards.shape != group_ids.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be "
                         "1-D of the same length; pass one reward and one group id per sequence")
    r = rewards.to(torch.float64)  # float64 so that near-equal rewards don't produce noise advantages
    _, group = torch.unique(group_ids, return_inverse=True)          # [N] dense 0..num_groups-1
    num_groups = int(group.max()) + 1 if len(group) else 0
    count = torch.zeros(num_groups, dtype=r.dtype).index_add_(0, group, torch.ones_like(r))
    mean = torch.zeros(num_groups, dtype=r.dtype).index_add_(0, group, r) / count
    centred = r - mean[group]
    if norm_std:
        sq = torch.zeros(num_groups, dtype=r.dtype).index_add_(0, group, centred**2)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))              # Bessel-corrected sample std
        centred = centred / (std[group] + eps)
    centred = torch.where(count[group] > 1, centred, torch.zeros_like(centred))
    return centred.to(torch.float32)


AdvantageFn = Callable[..., torch.Tensor]

ADVANTAGES: dict[str, AdvantageFn] = {
    "grpo": grpo_advantages,
}
"""Advantage estimators by ``algorithm.name``: ``fn(rewards[N], group_ids[N], norm_std) -> [N]``."""
