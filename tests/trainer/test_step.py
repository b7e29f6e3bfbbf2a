"""``TokenSums`` records: the fields are the reported stats, summed, then reduced as their metadata says."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from relayrl.trainer.critic import ValueStats
from relayrl.trainer.step import StepStats


def two_ranks(value: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM, dtype=None) -> torch.Tensor:
    """A fake all-reduce over two ranks that hold the same sums: SUM doubles, MAX keeps."""
    return value * 2 if op == dist.ReduceOp.SUM else value.clone()


def stats(**values: float) -> StepStats:
    base = {f.name: 0.0 for f in dataclasses.fields(StepStats)} | values
    return StepStats(**{k: torch.tensor(v) for k, v in base.items()})


def test_sums_add_and_ratio_max_keeps_the_largest():
    total = StepStats.zeros(torch.device("cpu"))
    total.add_(stats(loss=2.0, clip_frac=1.0, ratio_max=1.5)).add_(stats(loss=4.0, clip_frac=3.0, ratio_max=1.2))
    assert (float(total.loss), float(total.clip_frac), float(total.ratio_max)) == (6.0, 4.0, 1.5)


def test_reduce_divides_loss_by_the_denominator_and_the_rest_by_tokens():
    # two ranks, 2 epochs: loss 6 * 2 / 2 / denominator 3 = 2; clip_frac 4 * 2 / 2 / 8 tokens = .5
    out = stats(loss=6.0, clip_frac=4.0, entropy=12.0, ratio_max=1.5).reduce(
        two_ranks, epochs=2, tokens=torch.tensor(8.0), denominator=torch.tensor(3.0)
    )
    assert out.keys() == {f.name for f in dataclasses.fields(StepStats)}
    assert (out["loss"], out["clip_frac"], out["entropy"], out["ratio_max"]) == (2.0, 0.5, 1.5, 1.5)
    assert out["kl"] == 0.0


def test_value_stats_are_token_means():
    out = ValueStats(value_loss=torch.tensor(3.0), value_clip_frac=torch.tensor(1.0)).reduce(
        two_ranks, epochs=1, tokens=torch.tensor(4.0)
    )
    assert out == {"value_loss": 1.5, "value_clip_frac": pytest.approx(0.5)}
