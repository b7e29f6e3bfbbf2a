"""trainer.fused_adamw: torch's fused AdamW on CPU ranks gives the update of the default loop; ``adamw_step`` on
FSDP2 DTensors' local tensors gives exactly ``optimizer.step()``'s update and state."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from relayrl.trainer.optim import AdamWHyper, adamw, adamw_step, local_tensor

HYPER: AdamWHyper = {"lr": 0.1, "betas": (0.9, 0.999), "weight_decay": 0.01}


@pytest.mark.parametrize("fused", [True, False])
def test_one_step_by_hand(fused):
    # p = 1, g = 0.5: m = 0.05, v = 0.00025, bias-corrected 0.5 and 0.25, step lr * 0.5 / sqrt(0.25) = 0.1;
    # decoupled decay first: 1 * (1 - lr * wd) = 0.999, so p = 0.999 - 0.1 = 0.899.
    p = torch.nn.Parameter(torch.ones(3))
    opt = adamw([p], torch.device("cpu"), fused, **HYPER)
    p.grad = torch.full((3,), 0.5)
    opt.step()
    assert torch.allclose(p.detach(), torch.full((3,), 0.899), atol=1e-6)


def test_fused_only_on_cpu_and_when_asked():
    p = torch.nn.Parameter(torch.ones(2))
    assert adamw([p], torch.device("cpu"), True, lr=1e-3).defaults["fused"] is True
    assert adamw([p], torch.device("cpu"), False, lr=1e-3).defaults["fused"] is None
    assert adamw([p], torch.device("cuda"), True, lr=1e-3).defaults["fused"] is None


def test_fused_follows_the_default_loop_over_many_steps():
    torch.manual_seed(0)
    start = [torch.randn(64, 32), torch.randn(32)]
    runs = {}
    for fused in (True, False):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        opt = adamw(params, torch.device("cpu"), fused, lr=1e-2, betas=(0.9, 0.999), weight_decay=0.1)
        gen = torch.Generator().manual_seed(1)
        for _ in range(20):
            for q in params:
                q.grad = torch.randn(q.shape, generator=gen)
            opt.step()
        runs[fused] = [q.detach() for q in params]
    for a, b, s in zip(runs[True], runs[False], start):
        assert (a - s).abs().max() > 0.05  # both really moved
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor parameter's whole value (FSDP2 parameters are DTensors)."""
    assert isinstance(t, DTensor)
    return t.full_tensor()


def _sharded_mlp(seed: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    fully_shard(model, mesh=init_device_mesh("cpu", (1,), mesh_dim_names=("dp",)))  # in place
    return model


@pytest.mark.parametrize("fused, amsgrad", [(True, False), (False, False), (False, True)])
def test_local_step_is_the_dtensor_step(fused, amsgrad, one_rank_group):
    """Three steps on the same gradients: ``adamw_step`` leaves bit-identical parameters and state
    (DTensor moments, step counts) to torch's own ``step()`` on the DTensors, and both moved."""
    runs = []
    for local in (False, True):
        model = _sharded_mlp(0)
        start = [full(p).clone() for p in model.parameters()]
        opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1, fused=fused or None, amsgrad=amsgrad)
        if local:  # the local-tensor path must run, not a fall-back to step()
            opt.step = (  # type: ignore[method-assign]  # on this instance only
                lambda *a, **k: pytest.fail("adamw_step fell back to step() on FSDP2 DTensors")
            )
        gen = torch.Generator().manual_seed(1)
        for _ in range(3):
            model(torch.randn(5, 8, generator=gen)).square().sum().backward()
            assert all(type(p.grad).__name__ == "DTensor" for p in model.parameters())
            adamw_step(opt) if local else opt.step()
            opt.zero_grad(set_to_none=True)
        runs.append((model, opt, start))
    (theirs, their_opt, start), (ours, our_opt, _) = runs
    for p, q, s in zip(theirs.parameters(), ours.parameters(), start):
        assert (full(p) - s).abs().max() > 0.01
        assert torch.equal(full(p), full(q))
        a, b = their_opt.state[p], our_opt.state[q]
        assert a.keys() == b.keys() and a["step"].item() == b["step"].item() == 3
        for key in a.keys() - {"step"}:
            assert type(b[key]) is type(a[key]) and b[key].placements == a[key].placements
            assert torch.equal(a[key].full_tensor(), b[key].full_tensor())


def test_local_step_on_plain_tensors_and_other_optimizers_falls_back():
    """Plain parameters take the functional update too (same numbers as ``step()``); an optimizer that is
    not AdamW is left to its own ``step()``."""
    p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    mine, theirs = adamw([p], torch.device("cpu"), True, **HYPER), adamw([q], torch.device("cpu"), True, **HYPER)
    p.grad, q.grad = torch.full((3,), 0.5), torch.full((3,), 0.5)
    adamw_step(mine)
    theirs.step()
    assert torch.allclose(p.detach(), torch.full((3,), 0.899), atol=1e-6) and torch.equal(p, q)
    r = torch.nn.Parameter(torch.ones(2))
    r.grad = torch.ones(2)
    adamw_step(torch.optim.SGD([r], lr=0.5))
    assert r.detach().tolist() == [0.5, 0.5]


def test_local_step_on_fsdp2_strided_shards_of_tp_shards(one_rank_group):
    """FSDP2 over dp of a tp-split weight (pipeline stages with dp x tp) places it as (_StridedShard, Shard):
    element-wise AdamW still runs on the local tensors (no fall-back to ``step()``, whose fused kernel refuses a
    mix of such DTensors and plain tensors) and gives the plain update of those values."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.placement_types import Shard, _StridedShard

    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    placements = [_StridedShard(0, split_factor=2), Shard(0)]
    values, grads = torch.arange(6.0).reshape(3, 2), torch.full((3, 2), 0.5)
    p = torch.nn.Parameter(DTensor.from_local(values.clone(), mesh, placements))
    p.grad = DTensor.from_local(grads.clone(), mesh, placements)
    plain = torch.nn.Parameter(torch.ones(2))  # a plain tensor beside it, as a stage's final norm is
    plain.grad = torch.full((2,), 0.5)
    opt = adamw([p, plain], torch.device("cpu"), True, **HYPER)
    opt.step = lambda *a, **k: pytest.fail("adamw_step fell back to step()")  # type: ignore[method-assign]
    adamw_step(opt)
    q = torch.nn.Parameter(values.clone())
    q.grad = grads.clone()
    ref = adamw([q], torch.device("cpu"), True, **HYPER)
    ref.step()
    assert torch.equal(local_tensor(p), q.detach()) and not torch.equal(q.detach(), values)
    assert opt.state[p]["exp_avg"].placements == tuple(placements)
