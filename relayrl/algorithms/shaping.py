"""DAPO's two batch-shaping rules (Yu et al. 2025, arXiv:2503.14476), as pure functions the trainer applies
before computing advantages.

- **Overlong reward shaping** (sec. 3.4, eq. 13): a completion cut off at the generation budget is not
  necessarily wrong, and punishing it with the full failure reward is noise; a soft length penalty that
  starts ``L_cache`` tokens before the budget tells the model *that* it is too long, smoothly.
- **Dynamic sampling** (sec. 3.2): a group whose G completions all got the same reward has every grouped
  advantage equal to 0; it adds tokens (and denominators) to the step but no gradient, so the effective
  batch shrinks as accuracy nears 0 or 1. DAPO filters such groups out (and samples more to refill).

Both act on sequence lengths in *tokens* and on the total reward, which only the trainer sees together
(reward functions see text), so they live here rather than in ``relayrl.rewards``; the dynamic-sampling
filter needs no tensors and lives in ``filtering`` (the reward scorer counts what it keeps).
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer_len: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to each completion's reward (eq. 13, ``L_cache = buffer_len``)::

        R_length(|y|) =  0                                         |y| <= L_max - L_cache
                         factor * ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
                        -factor                                     |y| > L_max

    lengths: [N] completion lengths in tokens. Returns [N] float32 in [-factor, 0]. ``buffer_len = 0``
    turns it off (all zeros). The paper uses L_max = 20480, L_cache = 4096 (a fifth) and factor 1.
    """
    if buffer_len < 0 or max_len <= 0 or buffer_len > max_len:
        raise ValueError(
            f"overlong shaping needs 0 <= buffer_len={buffer_len} <= max_len={max_len} and max_len > 0; "
            "set algorithm.overlong_buffer to about a fifth of rollout.max_tokens"
        )
    lengths = lengths.to(torch.float32)
    if buffer_len == 0:
        return torch.zeros_like(lengths)
    soft = max_len - buffer_len
    ramp = (soft - lengths) / buffer_len
    return factor * torch.where(lengths <= soft, 0.0, torch.where(lengths > max_len, -1.0, ramp))
