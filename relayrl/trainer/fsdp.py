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
    if not trainable:     # trainable: the flags the caller left (every weight, or with LoRA the adapters only)
        model.requires_grad_(False)
    mp = MixedPrecisionPolicy(param_dtype=getattr(torch, dtype), reduce_dtype=torch.float32)
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in layer_classes:
            fully_shard(module, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def _params_by_mesh(model: torch.nn.Module) -> list[list[torch.nn.Parameter]]:
    """Parameters with a gradient, grouped by DTensor mesh (plain tensors together): DTensor ops refuse
    to mix meshes, and with TP the layer weights live on the 2-D ("dp", "tp") mesh, the rest on "dp"."""
    groups: dict = {}
    for p in model.parameters():
        if p.grad is not None:
            groups.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    return list(groups.values())


def global_grad_norm(groups: list[list[torch.nn.Parameter]]) -> torch.Tensor:
    """The L2 norm of the whole model's gradient: ``sqrt(sum_g ||g||^2)`` over the mesh groups
    (``_params_by_mesh``).

    Each group's norm is a DTensor whose ``full_tensor()`` reduces the shards' partial sums over its
    mesh, so every unique shard counts once: a weight split over (dp, tp) sums over both, one only
    FSDP-sharded (and replicated over tp) sums over dp alone. The result is the same on every rank.
    """
    total = torch.zeros((), dtype=torch.float32)
    for params in groups:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        total = total + norm.detach().float().cpu() ** 2
    return total.sqrt()


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Clip the global grad norm (``global_grad_norm``; ``grad_clip <= 0``: no clip), step, zero the grads.
    Returns the pre-clip norm; when it is NaN/inf the step is skipped (the caller counts it)."""
    groups = _params_by_mesh(model)
    norm = global_grad_norm(groups)
    if torch.isfinite(norm):   # the global norm is the same on every rank, so all skip together
        if grad_clip > 0:      # torch's rule: scale by min(1, max_norm / (norm + 1e-6))
            for params in groups:
                torch.nn.utils.clip_grads_with_norm_(params, grad_clip, norm.to(params[0].device))
        optimizer.step()       # a NaN/inf gradient would poison AdamW's moments for good: skip the step
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
