"""A NaN/inf gradient skips the optimizer step (weights and AdamW state untouched); K in a row stop the run."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from relayrl.controller.scheduler import Scheduler
from relayrl.trainer.fsdp import clip_and_step


def test_nonfinite_gradient_skips_the_step_and_finite_one_takes_it():
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    (model(torch.tensor([[float("nan"), 1.0, 2.0]])).sum()).backward()
    assert not torch.isfinite(torch.tensor(clip_and_step(model, opt, 1.0)))  # the NaN norm, step skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())) and not opt.state
    assert all(p.grad is None for p in model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    assert torch.isfinite(torch.tensor(clip_and_step(model, opt, 1.0)))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_k_bad_steps_in_a_row_stop_the_run():
    # a fake Scheduler: the two fields the check reads
    state: Any = SimpleNamespace(bad_steps=0, cfg=SimpleNamespace(trainer=SimpleNamespace(max_bad_steps=3)))
    for stats in (
        {"nonfinite_skips": 1.0},
        {"nonfinite_skips": 1.0},
        {"nonfinite_skips": 0.0},
        {"nonfinite_skips": 1.0},
        {"nonfinite_skips": 1.0},
    ):
        Scheduler._check_finite(state, stats)  # a good step in between resets the count
    with pytest.raises(RuntimeError, match="3 steps in a row had a NaN/inf gradient"):
        Scheduler._check_finite(state, {"nonfinite_skips": 2.0})
