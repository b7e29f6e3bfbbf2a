"""The trainer's optimizer: AdamW, with torch's fused kernel on CPU ranks (``trainer.fused_adamw``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypedDict, Unpack

import torch
from torch.distributed.tensor import DTensor
from torch.optim.adam import adam

from relayrl.config import TrainerConfig


class AdamWHyper(TypedDict, total=False):
    """The AdamW hyperparameters ``adamw`` passes on; one left out takes torch's default."""

    lr: float
    betas: tuple[float, float]
    weight_decay: float


def adamw(
    params: Iterable[torch.nn.Parameter], device: torch.device, fused: bool, **hyper: Unpack[AdamWHyper]
) -> torch.optim.AdamW:
    """AdamW over ``params`` with ``hyper`` (lr, betas, weight_decay). ``fused`` on a CPU rank: one kernel pass
    per tensor instead of torch's default loop of element-wise ops and their temporaries (the same update up
    to float rounding). GPU ranks keep torch's default (foreach) whatever ``fused`` says."""
    return torch.optim.AdamW(params, fused=True if fused and device.type == "cpu" else None, **hyper)


def policy_adamw(model: torch.nn.Module, device: torch.device, cfg: TrainerConfig) -> torch.optim.AdamW:
    """The policy's AdamW under ``trainer.*`` over its trainable parameters (LoRA: the adapters only)."""
    beta1, beta2 = cfg.betas
    return adamw(
        [p for p in model.parameters() if p.requires_grad],
        device,
        cfg.fused_adamw,
        lr=cfg.lr,
        betas=(beta1, beta2),
        weight_decay=cfg.weight_decay,
    )


def adamw_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()`` of an AdamW whose parameters are FSDP2 DTensors, run on their local tensors.

    AdamW is element-wise, so on any placement but Partial sums (Shard, FSDP2's strided shard of a tp shard,
    Replicate) each rank updating its own local tensors *is* the DTensor update, done by the same kernel. Going
    around DTensor matters because its dispatch of the one fused call over every parameter, gradient and moment
    is slow on its first call: it propagates sharding over four tensors per parameter in Python, on the path to
    the first step, while the kernel itself is the same either way. It also lets plain tensors (a pipeline
    stage's final norm) and DTensors share one fused call, which ``step()`` refuses. The moments stay DTensors
    in ``optimizer.state``, created as torch creates them, so checkpoints (DCP) see what ``step()`` would
    have left. Any other optimizer, or a layout this does not cover, takes ``optimizer.step()``."""
    if type(optimizer) is not torch.optim.AdamW or not all(
        _local_update_ok(p) for g in optimizer.param_groups for p in g["params"] if p.grad is not None
    ):
        optimizer.step()
        return
    with torch.no_grad():
        for group in optimizer.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                _adamw_group(optimizer, group, params)


def _local_update_ok(p: torch.Tensor) -> bool:
    """A plain tensor, or a DTensor whose gradient has its mesh and placements, none of them Partial sums."""
    g = p.grad
    if not isinstance(p, DTensor):
        return not isinstance(g, DTensor)
    return (
        isinstance(g, DTensor)
        and g.device_mesh == p.device_mesh
        and tuple(g.placements) == tuple(p.placements)
        and not any(pl.is_partial() for pl in p.placements)
    )


def _adamw_group(optimizer: torch.optim.AdamW, group: dict, params: list[torch.Tensor]) -> None:
    """torch's lazy state (as ``Adam._init_group`` makes it), then its functional AdamW on local tensors."""
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    on_device = group["fused"] or group["capturable"]
    for p in params:
        state = optimizer.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=scalar, device=p.device if on_device else "cpu")
            for key in ("exp_avg", "exp_avg_sq", *(("max_exp_avg_sq",) if group["amsgrad"] else ())):
                state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
    states = [optimizer.state[p] for p in params]
    beta1, beta2 = group["betas"]
    adam(
        [local_tensor(p) for p in params],
        [local_tensor(p.grad) for p in params if p.grad is not None],  # all of them: the caller kept those
        [local_tensor(s["exp_avg"]) for s in states],
        [local_tensor(s["exp_avg_sq"]) for s in states],
        [local_tensor(s["max_exp_avg_sq"]) for s in states] if group["amsgrad"] else [],
        [s["step"] for s in states],
        foreach=group["foreach"],
        capturable=group["capturable"],
        differentiable=group["differentiable"],
        fused=group["fused"],
        decoupled_weight_decay=True,
        amsgrad=group["amsgrad"],
        beta1=beta1,
        beta2=beta2,
        lr=group["lr"],
        weight_decay=group["weight_decay"],
        eps=group["eps"],
        maximize=group["maximize"],
    )


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor (the same storage under no_grad); a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t
