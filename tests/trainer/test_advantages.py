"""GRPO / Dr.GRPO advantages against hand-worked numbers, plus per-group invariants."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.trainer.advantages import ADVANTAGES, grpo_advantages


def test_grpo_hand_numbers():
    # group 0: rewards 1,0,1,0 -> mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.5/0.57735 = +-0.86603
    # group 1: all equal -> 0;  group 2: a single sample has no baseline -> 0
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 2.0, 2.0, 3.0])
    groups = torch.tensor([7, 7, 7, 7, 3, 3, 9])
    adv = grpo_advantages(rewards, groups)
    expected = torch.tensor([0.866025, -0.866025, 0.866025, -0.866025, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert adv.dtype == torch.float32


def test_grpo_two_samples_uses_bessel_std():
    # rewards 0, 3: mean 1.5, sample std = sqrt(2 * 1.5^2 / 1) = 2.12132 -> +-1.5 / 2.12132 = +-0.70711
    # (population std 1.5 would give +-1.0)
    adv = grpo_advantages(torch.tensor([0.0, 3.0]), torch.tensor([0, 0]))
    torch.testing.assert_close(adv, torch.tensor([-0.707107, 0.707107]), atol=1e-5, rtol=0)


def test_dr_grpo_only_centres():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 1.0])
    adv = grpo_advantages(rewards, torch.tensor([0, 0, 0, 0, 1, 1]), norm_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.5, -0.5, 2.0, -2.0]))


def test_interleaved_group_ids():
    adv = grpo_advantages(torch.tensor([1.0, 10.0, 0.0, 20.0]), torch.tensor([0, 1, 0, 1]), norm_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.5, -5.0, -0.5, 5.0]))


def test_registry_and_bad_shapes():
    assert ADVANTAGES["grpo"] is grpo_advantages
    with pytest.raises(ValueError, match="same length"):
        grpo_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.floats(-10, 10, allow_nan=False)), min_size=1, max_size=40),
       st.booleans())
def test_zero_mean_and_unit_std_per_group(samples, norm_std):
    groups = torch.tensor([g for g, _ in samples])
    rewards = torch.tensor([r for _, r in samples], dtype=torch.float64)
    adv = grpo_advantages(rewards, groups, norm_std=norm_std).double()
    for g in groups.unique():
        a, r = adv[groups == g], rewards[groups == g]
        assert abs(a.mean().item()) < 1e-5
        if norm_std and len(r) > 1 and r.std().item() > 1e-2:
            assert math.isclose(a.std().item(), 1.0, abs_tol=1e-3)
        if not norm_std and len(r) > 1:
            torch.testing.assert_close(a, r - r.mean(), atol=1e-5, rtol=1e-5)
