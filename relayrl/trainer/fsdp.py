"""FSDP2 helpers shared by the policy (``actor.py``) and the critic (``critic.py``): shard, clip + step."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from relayrl.trainer.optim import adamw_step, local_tensor
from relayrl.trainer.recompute import checkpoint_layers


def shard_model(
    model: torch.nn.Module, mesh: DeviceMesh, dtype: str, trainable: bool, checkpoint_every: int = 0
) -> torch.nn.Module:
    """``fully_shard`` each decoder layer, then the root; eval mode; float32 master weights; a trainable
    model's every ``checkpoint_every``-th layer activation-checkpointed first (``recompute.py``; 0: none).

    Sharding each layer separately lets FSDP2 gather one layer at a time (memory ~ one layer, not the
    model); the root owns what is left (embeddings, final norm, a tied lm_head or a value head). With
    ``dtype=bfloat16`` compute runs in bf16 while weights, grads and AdamW states stay float32. Eval mode
    keeps dropout off, so a forward before an update and the first training forward agree exactly.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model.eval()
    if not trainable:  # trainable: the flags the caller left (every weight, or with LoRA the adapters only)
        model.requires_grad_(False)
    else:
        checkpoint_layers(model, checkpoint_every)  # before fully_shard, as torchtitan orders them
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
    groups: dict[DeviceMesh | None, list[torch.nn.Parameter]] = {}
    for p in model.parameters():
        if p.grad is not None:
            groups.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    return list(groups.values())


def global_grad_norm(groups: list[list[torch.nn.Parameter]]) -> torch.Tensor:
    """The L2 norm of the whole model's gradient: ``sqrt(sum_g ||g||^2)`` over the mesh groups
    (``_params_by_mesh``); the same on every rank, on the CPU."""
    total = torch.zeros((), dtype=torch.float32)
    for params in groups:
        total = total + squared_norm([p.grad for p in params if p.grad is not None])  # all: see _params_by_mesh
    return total.sqrt()


def squared_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """``||g||^2`` of one mesh group's gradients, each unique shard counted once.

    FSDP alone (a 1-D mesh, every gradient sharded): the ranks hold disjoint shards, so the local tensors'
    squared norms add up over the mesh, one all-reduce. On plain tensors this skips DTensor's dispatch,
    whose first call per op and shape propagates sharding in Python (a cost paid in the first update, once
    per gradient shape) for a sum that needs none. Any other layout (TP's 2-D mesh, replicated placements)
    takes the DTensor norm, whose ``full_tensor()`` sums each mesh dimension's partial norms as its
    placements say."""
    dtensors = [g for g in grads if isinstance(g, DTensor)]  # all or none of them: one mesh group
    mesh = dtensors[0].device_mesh if dtensors else None
    if mesh is not None and mesh.ndim == 1 and all(p.is_shard() for g in dtensors for p in g.placements):
        local = torch.nn.utils.get_total_norm([g.to_local() for g in dtensors], norm_type=2.0).float() ** 2
        if mesh.size() > 1:
            torch.distributed.all_reduce(local, group=mesh.get_group())
        return local.detach().cpu()
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    return norm.detach().float().cpu() ** 2


def clip_grads(groups: list[list[torch.nn.Parameter]], max_norm: float, norm: torch.Tensor) -> None:
    """torch's rule (``clip_grads_with_norm_``): scale every gradient by ``min(1, max_norm / (norm + 1e-6))``.
    Applied to the local tensors: one scalar scales every shard and replica alike, and plain tensors skip
    DTensor's dispatch (see ``squared_norm``)."""
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for params in groups:
        grads = [local_tensor(p.grad) for p in params if p.grad is not None]  # all: see _params_by_mesh
        torch._foreach_mul_(grads, coef.to(grads[0].device))


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Clip the global grad norm (``global_grad_norm``; ``grad_clip <= 0``: no clip), step, zero the grads.
    Returns the pre-clip norm; when it is NaN/inf the step is skipped (the caller counts it)."""
    groups = _params_by_mesh(model)
    norm = global_grad_norm(groups)
    if torch.isfinite(norm):  # the global norm is the same on every rank, so all skip together
        if grad_clip > 0:
            clip_grads(groups, grad_clip, norm)
        adamw_step(optimizer)  # a NaN/inf gradient would poison AdamW's moments for good: skip the step
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
