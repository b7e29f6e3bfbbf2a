"""The trainer's optimizer: AdamW, with torch's fused kernel on CPU ranks (``trainer.fused_adamw``)."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def adamw(params: Iterable[torch.nn.Parameter], device: torch.device, fused: bool, **hyper: object) -> torch.optim.AdamW:
    """AdamW over ``params`` with ``hyper`` (lr, betas, weight_decay). ``fused`` on a CPU rank: one kernel pass
    per tensor instead of torch's default loop of element-wise ops and their temporaries (the same update up
    to float rounding). GPU ranks keep torch's default (foreach) whatever ``fused`` says."""
    return torch.optim.AdamW(params, fused=True if fused and device.type == "cpu" else None, **hyper)
