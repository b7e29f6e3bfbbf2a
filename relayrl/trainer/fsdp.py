"""FSDP2 helpers shared by the policy (``actor.py``) and the critic (``critic.py``): shard, clip + step."""

from __future__ import annotations

import torch


def shard_model(model: torch.nn.Module, mesh, dtype: str, trainable: bool) -> torch.nn.Module:
    """``fully_shard`` each decoder layer, then the root; eval mode; float32 master weights.

    Sharding each layer separately lets FSDP2 gather one layer at a time (memory ~ one layer, not the
    model); the root owns what is left (embeddings, final norm, a tied lm_head or a value head). With
    ``dtype=bfloat16`` compute runs in bf16 while weights, grads and AdamW states stay float32. Eval mode
    keeps dropout off, so a forward before an update and the first training forward agree exactly.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model.eval()
    model.requires_grad_(trainable)
    mp = MixedPrecisionPolicy(param_dtype=getattr(torch, dtype), reduce_dtype=torch.float32)
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Clip the global grad norm (DTensor-aware; ``grad_clip <= 0``: no clip), step, zero the grads.
    Returns the pre-clip norm; when it is NaN/inf the step is skipped (the caller counts it)."""
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    if torch.isfinite(norm):   # the global norm is the same on every rank, so all skip together
        optimizer.step()       # a NaN/inf gradient would poison AdamW's moments for good: skip the step
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
