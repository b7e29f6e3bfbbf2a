"""The trainer's optimizer: AdamW, with torch's fused kernel on CPU ranks (``trainer.fused_adamw``)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from relayrl.config import TrainerConfig


def adamw(params: Iterable[torch.nn.Parameter], device: torch.device, fused: bool, **hyper: object) -> torch.optim.AdamW:
    """AdamW over ``params`` with ``hyper`` (lr, betas, weight_decay). ``fused`` on a CPU rank: one kernel pass
    per tensor instead of torch's default loop of element-wise ops and their temporaries (the same update up
    to float rounding). GPU ranks keep torch's default (foreach) whatever ``fused`` says."""
    return torch.optim.AdamW(params, fused=True if fused and device.type == "cpu" else None, **hyper)


def policy_adamw(model: torch.nn.Module, device: torch.device, cfg: TrainerConfig) -> torch.optim.AdamW:
    """The policy's AdamW under ``trainer.*`` over its trainable parameters (LoRA: the adapters only)."""
    return adamw([p for p in model.parameters() if p.requires_grad], device, cfg.fused_adamw, lr=cfg.lr,
                 betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
