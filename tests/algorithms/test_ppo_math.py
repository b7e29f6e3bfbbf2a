"""PPO's advantage wiring on hand examples: outcome reward at the last token, KL penalty per token, GAE against
the critic's values, and whitening with step-wide moments (as the trainer does across micro-batches/ranks)."""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.algorithms.advantages import (
    gae_advantages,
    last_token_rewards,
    masked_moments,
    masked_whiten,
    moments_mean_var,
    outcome_gae,
    whiten_from_moments,
)
from relayrl.algorithms.kl import kl_penalized_rewards


def test_outcome_gae_hand_numbers_gamma_lam_one():
    # gamma = lam = 1: A_t = R - V_t (the reward-to-go is R at every position), returns = R.
    # row 0: mask 1,1,0, R = 1, V = .2, .4  -> A = .8, .6 ; returns 1, 1
    # row 1: mask 0,1,1 (a prompt position first), R = .5, V = .3, .6 -> A = .2, -.1 ; returns .5, .5
    rewards = torch.tensor([1.0, 0.5])
    values = torch.tensor([[0.2, 0.4, 9.0], [9.0, 0.3, 0.6]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    adv, ret = outcome_gae(rewards, values, mask)
    torch.testing.assert_close(adv, torch.tensor([[0.8, 0.6, 0.0], [0.0, 0.2, -0.1]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.5, 0.5]]))


def test_outcome_gae_with_kl_penalty_hand_numbers():
    # gamma .9, lam .5 (gamma*lam .45); R = 1, V = .2, .4, penalty .1, .2 -> token rewards -.1, .8
    #   t=1: delta = .8 + 0 - .4 = .4                       A1 = .4
    #   t=0: delta = -.1 + .9*.4 - .2 = .06                 A0 = .06 + .45*.4 = .24
    #   returns = A + V = .44, .8
    adv, ret = outcome_gae(
        torch.tensor([1.0]),
        torch.tensor([[0.2, 0.4]]),
        torch.ones(1, 2),
        gamma=0.9,
        lam=0.5,
        kl_penalty=torch.tensor([[0.1, 0.2]]),
    )
    torch.testing.assert_close(adv, torch.tensor([[0.24, 0.4]]))
    torch.testing.assert_close(ret, torch.tensor([[0.44, 0.8]]))


def test_outcome_gae_penalty_is_kl_penalized_rewards():
    # the trainer passes kl_coef * k1(old, ref); the same as losses.kl_penalized_rewards then plain GAE
    g = torch.Generator().manual_seed(0)
    old, ref = -torch.rand(3, 5, generator=g) * 3, -torch.rand(3, 5, generator=g) * 3
    values, mask = torch.randn(3, 5, generator=g), torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 1, 0, 1]])
    rewards = torch.tensor([1.0, 0.0, 0.5])
    adv, ret = outcome_gae(rewards, values, mask, 0.95, 0.9, kl_penalty=0.05 * (old - ref))
    token_rewards, _ = kl_penalized_rewards(last_token_rewards(rewards, mask), old, ref, mask, coef=0.05)
    adv2, ret2 = gae_advantages(token_rewards, values, mask, 0.95, 0.9)
    torch.testing.assert_close(adv, adv2)
    torch.testing.assert_close(ret, ret2)


def test_moments_hand_numbers():
    # masked 1, 2, 3, 4 (the 9 is masked): n 4, sum 10, sum of squares 30; mean 2.5, sample var 5/3
    x, mask = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 0.0]]), torch.tensor([[1, 1, 0], [1, 1, 0]])
    m = masked_moments(x, mask)
    assert m.tolist() == [4.0, 10.0, 30.0] and m.dtype == torch.float64
    mean, var = moments_mean_var(m)
    assert (mean.item(), var.item()) == (2.5, pytest.approx(5 / 3))
    assert moments_mean_var(masked_moments(x, torch.zeros(2, 3)))[1].item() == 0.0


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=2, max_value=6), st.integers(min_value=1, max_value=4), st.integers(0, 10_000))
def test_whitening_with_step_moments_equals_whitening_the_whole_step(rows, parts, seed):
    # what the trainer does: moments summed over micro-batches (and ranks), each part whitened with them
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows * parts, 4, generator=g)
    mask = (torch.rand(rows * parts, 4, generator=g) < 0.7).long()
    mask[0, :2] = 1  # at least two tokens
    chunks = list(zip(x.split(rows), mask.split(rows)))
    total = functools.reduce(torch.add, (masked_moments(xc, mc) for xc, mc in chunks))
    pieces = torch.cat([whiten_from_moments(xc, mc, total) for xc, mc in chunks])
    torch.testing.assert_close(pieces, masked_whiten(x, mask), atol=1e-5, rtol=1e-5)
