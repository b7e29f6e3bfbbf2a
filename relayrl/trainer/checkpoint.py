"""Sharded trainer checkpoints with torch Distributed Checkpoint (DCP), restored exactly.

Every rank calls ``save``/``load`` together. DCP writes each rank's shards of the model and the
optimizer (no gather, no pickle); each rank's RNG state goes to its own small tensor file, loaded with
``weights_only=True`` (no unpickling of arbitrary objects). Atomicity is the caller's job: write into a
temporary directory and rename it once everything, the driver's state included, is on disk.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def _modules(parts: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]) -> dict[str, dict]:
    """``{"policy": {"model": ..., "optim": ...}, ...}``: DCP state dicts (sharded, no gather)."""
    out = {}
    for name, (model, optim) in parts.items():
        model_sd, optim_sd = get_state_dict(model, optim)
        out[name] = {"model": model_sd, "optim": optim_sd}
    return out


def init_optimizer_state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state tensors (AdamW's moments appear on the first step) so that DCP
    has somewhere to load them: one step with zero gradients at lr 0 changes no parameter."""
    if optim.state:
        return
    lrs = [g["lr"] for g in optim.param_groups]
    for g in optim.param_groups:
        g["lr"] = 0.0
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optim.step()
    optim.zero_grad(set_to_none=True)
    for g, lr in zip(optim.param_groups, lrs):
        g["lr"] = lr


def save(path: Path, parts: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]], rank: int) -> None:
    """Collective: shards of every ``(model, optimizer)`` in ``parts`` under ``path/dcp``, RNG per rank."""
    for model, optim in parts.values():
        init_optimizer_state(model, optim)
    dcp.save(_modules(parts), checkpoint_id=str(path / "dcp"))
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, path / f"rng-rank{rank}.pt")


def load(path: Path, parts: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]], rank: int) -> None:
    """Collective: restore what ``save`` wrote into the live (already sharded) modules and optimizers."""
    for model, optim in parts.values():
        init_optimizer_state(model, optim)
    state = _modules(parts)
    dcp.load(state, checkpoint_id=str(path / "dcp"))
    for name, (model, optim) in parts.items():
        set_state_dict(model, optim, model_state_dict=state[name]["model"], optim_state_dict=state[name]["optim"])
    rng = torch.load(path / f"rng-rank{rank}.pt", weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
