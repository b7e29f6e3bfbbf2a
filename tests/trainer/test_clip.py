"""Global gradient norm and clipping: hand-worked numbers on plain tensors and on FSDP2 DTensor gradients
(the local-tensor path), and the same result as DTensor's own norm."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.tensor import DTensor

from relayrl.trainer.fsdp import _params_by_mesh, clip_grads, global_grad_norm, squared_norm

NORM = math.sqrt(4 * 1.0**2 + 2 * 2.0**2)  # weight grad: four 1s, bias grad: two 2s -> sqrt(12) = 3.4641


def linear_with_grads(shard: bool) -> torch.nn.Linear:
    model = torch.nn.Linear(2, 2)
    if shard:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh("cpu", (1,), mesh_dim_names=("dp",)))
    model.weight.grad = torch.ones_like(model.weight)
    model.bias.grad = torch.full_like(model.bias, 2.0)
    return model


def local(grad: torch.Tensor | None) -> torch.Tensor:
    assert grad is not None
    return grad.to_local() if isinstance(grad, DTensor) else grad


@pytest.mark.parametrize("shard", [False, True])
def test_norm_and_clip_by_hand(shard, one_rank_group):
    model = linear_with_grads(shard)
    groups = _params_by_mesh(model)
    norm = global_grad_norm(groups)
    assert norm.item() == pytest.approx(NORM, rel=1e-6)
    clip_grads(groups, 1.0, norm)  # scale 1 / (3.4641 + 1e-6) = 0.288675
    assert local(model.weight.grad).flatten().tolist() == pytest.approx([0.288675] * 4, rel=1e-5)
    assert local(model.bias.grad).tolist() == pytest.approx([0.57735] * 2, rel=1e-5)


def test_clip_leaves_a_norm_below_the_limit(one_rank_group):
    model = linear_with_grads(shard=True)
    groups = _params_by_mesh(model)
    clip_grads(groups, 10.0, global_grad_norm(groups))
    assert local(model.bias.grad).tolist() == [2.0, 2.0]


def test_local_path_equals_dtensor_norm(one_rank_group):
    model = linear_with_grads(shard=True)
    grads = [p.grad for p in model.parameters() if isinstance(p.grad, DTensor)]
    assert len(grads) == len(list(model.parameters()))  # all DTensors: the local-tensor path runs
    theirs = torch.nn.utils.get_total_norm(grads)
    assert isinstance(theirs, DTensor)
    theirs = theirs.full_tensor()
    assert squared_norm(grads).item() == pytest.approx(theirs.item() ** 2, rel=1e-6)
