"""trainer.fused_adamw: torch's fused AdamW on CPU ranks gives the update of the default loop."""

from __future__ import annotations

import pytest
import torch

from relayrl.trainer.optim import adamw

HYPER = {"lr": 0.1, "betas": (0.9, 0.999), "weight_decay": 0.01}


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
        assert (a - s).abs().max() > 0.05                     # both really moved
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
