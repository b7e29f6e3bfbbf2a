"""Advantage estimators (GRPO family, RLOO, REINFORCE++, GAE) against hand-worked numbers, plus invariants."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.algorithms.advantages import (
    ADVANTAGES,
    WHITENED,
    discounted_returns,
    dr_grpo_advantages,
    gae_advantages,
    grpo_advantages,
    last_token_rewards,
    masked_whiten,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    reinforce_pp_token_advantages,
    rloo_advantages,
    sequence_advantages,
)


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
@given(
    st.lists(st.tuples(st.integers(0, 4), st.floats(-10, 10, allow_nan=False)), min_size=1, max_size=40), st.booleans()
)
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


# ------------------------------------------------------------------------- Dr.GRPO, RLOO, REINFORCE++
def test_registry_holds_every_sequence_estimator():
    assert {
        "grpo": grpo_advantages,
        "dr_grpo": dr_grpo_advantages,
        "rloo": rloo_advantages,
        "reinforce_pp": reinforce_pp_advantages,
        "reinforce_pp_baseline": reinforce_pp_baseline_advantages,
    } == ADVANTAGES
    for fn in ADVANTAGES.values():  # one common signature, one common error
        with pytest.raises(ValueError, match="same length"):
            fn(torch.zeros(3), torch.zeros(2, dtype=torch.long))


def test_dr_grpo_hand_numbers():
    # group 0: 1,0,1,0 -> mean .5 -> +-.5 ; group 1: 5,1 -> mean 3 -> +-2 ; group 2 (alone) -> 0
    adv = dr_grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 1.0, 4.0]), torch.tensor([0, 0, 0, 0, 1, 1, 2]))
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.5, -0.5, 2.0, -2.0, 0.0]))


def test_rloo_hand_numbers():
    # group 0 (1,0,1,0): r=1 -> 1 - (0+1+0)/3 = 2/3 ; r=0 -> 0 - (1+1+0)/3 = -2/3  (= 4/3 * (r - .5))
    # group 1 (5,1): 5 - 1 = 4, 1 - 5 = -4 ; group 2 (alone): no other sample -> 0
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 1.0, 4.0]), torch.tensor([0, 0, 0, 0, 1, 1, 2]))
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -2 / 3, 2 / 3, -2 / 3, 4.0, -4.0, 0.0]))
    assert adv.dtype == torch.float32


def test_reinforce_pp_sequence_whitening_weighs_each_completion_once():
    # rewards 1,0,0,0,3: mean .8, deviations .2,-.8,-.8,-.8,2.2, sum of squares 6.8, sample var 6.8/4 = 1.7,
    # std 1.303840 -> .2/1.30384 = .153393, -.8/1.30384 = -.613572, 2.2/1.30384 = 1.687323. Groups are ignored.
    adv = reinforce_pp_advantages(
        torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0]), torch.tensor([0, 0, 1, 1, 2]), whiten="sequence"
    )
    torch.testing.assert_close(
        adv, torch.tensor([0.153393, -0.613572, -0.613572, -0.613572, 1.687323]), atol=1e-5, rtol=0
    )
    # a batch of one or of equal rewards carries no signal
    assert reinforce_pp_advantages(torch.tensor([3.0]), torch.tensor([0]), whiten="sequence").tolist() == [0.0]
    assert reinforce_pp_advantages(torch.full((4,), 2.0), torch.arange(4), whiten="sequence").abs().max() < 1e-6


def test_reinforce_pp_token_whitening_hand_numbers():
    # lengths 1 and 3, rewards 1 and 0: the tokens carry 1 | 0, 0, 0 -> n = 4, mean = 1/4,
    # sample var = ((3/4)^2 + 3 (1/4)^2) / 3 = (9/16 + 3/16) / 3 = 1/4, std = 1/2
    # -> A_1 = (1 - 1/4) / (1/2) = 1.5, A_2 = (0 - 1/4) / (1/2) = -0.5 (token mean of A: (1.5 - 3 * .5) / 4 = 0)
    # per sequence it would be +-0.707107 (mean 1/2, std sqrt(1/2)): the long answer weighs 3x here.
    rewards, groups, counts = torch.tensor([1.0, 0.0]), torch.tensor([0, 1]), torch.tensor([1, 3])
    torch.testing.assert_close(
        reinforce_pp_advantages(rewards, groups, counts), torch.tensor([1.5, -0.5]), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        reinforce_pp_advantages(rewards, groups, counts, whiten="sequence"),
        torch.tensor([0.707107, -0.707107]),
        atol=1e-5,
        rtol=0,
    )
    # a sequence with no trained token gets 0 and does not move the statistics
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0.0, 9.0]), torch.tensor([0, 1, 2]), torch.tensor([1, 3, 0]))
    torch.testing.assert_close(adv, torch.tensor([1.5, -0.5, 0.0]), atol=1e-5, rtol=0)


def test_reinforce_pp_token_whitening_needs_counts_and_a_known_mode():
    with pytest.raises(ValueError, match="whiten='token' needs token_counts"):
        reinforce_pp_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="whiten='batch' is not supported; use token or sequence"):
        reinforce_pp_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]), torch.tensor([1, 1]), "batch")
    with pytest.raises(ValueError, match="token_counts"):
        reinforce_pp_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]), torch.tensor([1, 1, 1]))


def test_reinforce_pp_baseline_token_whitening_hand_numbers():
    # groups {1, 0} (lengths 1, 3) and {1, 1} (lengths 2, 2): centred c = .5, -.5, 0, 0.
    # tokens: .5 | -.5 x3 | 0 x4 -> n = 8, mean = (.5 - 1.5) / 8 = -.125;
    # squares: (.625)^2 + 3 (-.375)^2 + 4 (.125)^2 = .390625 + .421875 + .0625 = .875, var .875/7 = .125,
    # std .353553 -> (.5 + .125)/.353553 = 1.767767, (-.5 + .125)/.353553 = -1.060660, .125/.353553 = .353553
    adv = reinforce_pp_baseline_advantages(
        torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]), torch.tensor([1, 3, 2, 2])
    )
    torch.testing.assert_close(adv, torch.tensor([1.767767, -1.060660, 0.353553, 0.353553]), atol=1e-5, rtol=0)


def test_sequence_advantages_hands_counts_only_to_whitened_estimators():
    rewards, groups, counts = torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.tensor([1, 3])
    assert WHITENED == ("reinforce_pp", "reinforce_pp_baseline")
    torch.testing.assert_close(
        sequence_advantages("reinforce_pp", rewards, groups, counts), torch.tensor([1.5, -0.5]), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        sequence_advantages("reinforce_pp", rewards, groups, counts, "sequence"),
        torch.tensor([0.707107, -0.707107]),
        atol=1e-5,
        rtol=0,
    )
    # GRPO is per group, each completion once, whatever the lengths
    torch.testing.assert_close(sequence_advantages("grpo", rewards, groups, counts), grpo_advantages(rewards, groups))


def test_token_whitening_equals_whitening_the_broadcast_advantages():
    # the per-sequence shortcut must equal masked_whiten of each reward copied onto its tokens
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 1, 1, 1], [1, 1, 1, 0]])
    rewards = torch.tensor([0.3, 1.0, -2.0, 0.5])
    seq = reinforce_pp_advantages(rewards, torch.arange(4), mask.sum(1))
    expected = masked_whiten(rewards[:, None].expand(4, 4), mask)
    torch.testing.assert_close(seq[:, None].expand(4, 4) * mask, expected, atol=1e-5, rtol=0)


def test_reinforce_pp_baseline_centres_per_group_scales_per_batch():
    # centred per group: [.5,-.5,.5,-.5] and [1,-1]; batch mean 0, sum of squares 4*.25 + 2*1 = 3,
    # sample var 3/5 = .6, std .774597 -> .5/.774597 = .645497, 1/.774597 = 1.290994
    # (GRPO would give +-.866025 and +-.707107: per-group std)
    adv = reinforce_pp_baseline_advantages(
        torch.tensor([1.0, 0.0, 1.0, 0.0, 4.0, 2.0]), torch.tensor([0, 0, 0, 0, 1, 1]), whiten="sequence"
    )
    a, b = 0.645497, 1.290994
    torch.testing.assert_close(adv, torch.tensor([a, -a, a, -a, b, -b]), atol=1e-5, rtol=0)


grouped_samples = st.lists(st.tuples(st.integers(0, 4), st.floats(-10, 10, allow_nan=False)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(grouped_samples, st.sampled_from(["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"]))
def test_grouped_estimators_are_zero_mean_per_group(samples, name):
    groups = torch.tensor([g for g, _ in samples])
    kw = {"whiten": "sequence"} if name in WHITENED else {}
    adv = ADVANTAGES[name](torch.tensor([r for _, r in samples], dtype=torch.float64), groups, **kw).double()
    for g in groups.unique():
        assert abs(adv[groups == g].mean().item()) < 1e-4


@settings(max_examples=150, deadline=None)
@given(grouped_samples)
def test_rloo_is_reward_minus_mean_of_the_others(samples):
    groups = torch.tensor([g for g, _ in samples])
    rewards = torch.tensor([r for _, r in samples], dtype=torch.float64)
    adv = rloo_advantages(rewards, groups).double()
    for i in range(len(samples)):
        others = rewards[(groups == groups[i]) & (torch.arange(len(samples)) != i)]
        expected = rewards[i] - others.mean() if len(others) else torch.tensor(0.0, dtype=torch.float64)
        assert adv[i].item() == pytest.approx(expected.item(), abs=1e-4)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=40))
def test_reinforce_pp_has_zero_mean_unit_std_over_the_batch(rewards):
    r = torch.tensor(rewards, dtype=torch.float64)
    adv = reinforce_pp_advantages(r, torch.zeros(len(r), dtype=torch.long), whiten="sequence").double()
    assert abs(adv.mean().item()) < 1e-5
    if r.std().item() > 1e-2:
        assert adv.std().item() == pytest.approx(1.0, abs=1e-3)


# ------------------------------------------------------------------------- token level: GAE, returns
def test_last_token_rewards():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
    out = last_token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    torch.testing.assert_close(out, torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="one per row"):
        last_token_rewards(torch.zeros(2), mask)


def test_gae_hand_numbers_right_padding_and_holes():
    # gamma = .9, lam = .8 (gamma*lam = .72).
    # row 0, mask 1,1,1,0 (right padding; the pad's reward 9 and value 7 must be ignored):
    #   t=2: delta = 1 + .9*0 - .8 = .2                 A2 = .2
    #   t=1: delta = 0 + .9*.8 - .6 = .12                A1 = .12 + .72*.2   = .264
    #   t=0: delta = 0 + .9*.6 - .5 = .04                A0 = .04 + .72*.264 = .23008
    #   returns = A + V = .73008, .864, 1.0
    # row 1, mask 0,1,0,1 (a prompt position, then a hole the recursion bridges):
    #   t=3: delta = 1 - .2 = .8                         A3 = .8
    #   t=1: delta = 0 + .9*.2 - .5 = -.32 (next *masked* value is V3 = .2)   A1 = -.32 + .72*.8 = .256
    #   returns: V1 + A1 = .756, V3 + A3 = 1.0
    rewards = torch.tensor([[0.0, 0.0, 1.0, 9.0], [5.0, 0.0, 5.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.8, 7.0], [3.0, 0.5, 3.0, 0.2]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 0, 1]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, torch.tensor([[0.23008, 0.264, 0.2, 0.0], [0.0, 0.256, 0.0, 0.8]]))
    torch.testing.assert_close(ret, torch.tensor([[0.73008, 0.864, 1.0, 0.0], [0.0, 0.756, 0.0, 1.0]]))


def test_gae_lam_zero_is_one_step_td_error():
    # lam = 0: A_t = r_t + gamma V_{t+1} - V_t = [0 + .5*2 - 1, 3 + 0 - 2] = [0, 1]
    adv, _ = gae_advantages(torch.tensor([[0.0, 3.0]]), torch.tensor([[1.0, 2.0]]), torch.ones(1, 2), 0.5, 0.0)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 1.0]]))


def test_gae_bad_input():
    with pytest.raises(ValueError, match="values"):
        gae_advantages(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="gamma"):
        gae_advantages(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), gamma=1.5)


def test_discounted_returns_and_whiten():
    # gamma .5: G3 = 2, G2 = 0 + .5*2 = 1, G1 = 1 + .5*1 = 1.5, G0 = 0 + .5*1.5 = .75
    g = discounted_returns(torch.tensor([[0.0, 1.0, 0.0, 2.0]]), torch.ones(1, 4), gamma=0.5)
    torch.testing.assert_close(g, torch.tensor([[0.75, 1.5, 1.0, 2.0]]))
    # masked entries 1,2,3 (the 100 is off the mask): mean 2, sample std 1 -> -1, 0, 1
    w = masked_whiten(torch.tensor([[1.0, 2.0], [3.0, 100.0]]), torch.tensor([[1, 1], [1, 0]]))
    torch.testing.assert_close(w, torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))


def test_reinforce_pp_token_advantages():
    # returns-to-go (gamma 1): row 0 [1, 1], row 1 [3, -] -> entries 1,1,3: mean 5/3, deviations -2/3,-2/3,4/3,
    # sum of squares 24/9, sample var 4/3, std 1.154701 -> -.577350, -.577350, 1.154701
    adv = reinforce_pp_token_advantages(torch.tensor([[0.0, 1.0], [3.0, 0.0]]), torch.tensor([[1, 1], [1, 0]]))
    torch.testing.assert_close(adv, torch.tensor([[-0.577350, -0.577350], [1.154701, 0.0]]), atol=1e-5, rtol=0)


def _right_padded(draw_rows):
    rows, T = draw_rows
    rewards = torch.tensor([[r for r, _ in row] + [7.0] * (T - len(row)) for row in rows], dtype=torch.float64)
    values = torch.tensor([[v for _, v in row] + [-5.0] * (T - len(row)) for row in rows], dtype=torch.float64)
    mask = torch.tensor([[1] * len(row) + [0] * (T - len(row)) for row in rows])
    return rewards, values, mask


token = st.tuples(st.floats(-3, 3, allow_nan=False), st.floats(-3, 3, allow_nan=False))
padded_batch = st.lists(st.lists(token, min_size=0, max_size=8), min_size=1, max_size=5).map(
    lambda rows: (rows, max(1, max(len(r) for r in rows)))
)


@settings(max_examples=150, deadline=None)
@given(padded_batch)
def test_gae_lam1_gamma1_is_reward_to_go_minus_value(rows):
    rewards, values, mask = _right_padded(rows)
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    on = mask.bool()
    to_go = torch.where(on, rewards, 0).flip(1).cumsum(1).flip(1)  # sum_{k >= t} r_k over real tokens
    torch.testing.assert_close(adv.double(), torch.where(on, to_go - values, 0), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(ret.double(), torch.where(on, to_go, 0), atol=1e-4, rtol=1e-5)


@settings(max_examples=150, deadline=None)
@given(padded_batch, st.floats(0, 1), st.floats(0, 1))
def test_gae_is_discounted_sum_of_td_errors(rows, gamma, lam):
    rewards, values, mask = _right_padded(rows)
    adv, _ = gae_advantages(rewards, values, mask, gamma, lam)
    for b in range(len(rewards)):
        n = int(mask[b].sum())
        v_next = torch.cat([values[b, 1:n], torch.zeros(1, dtype=torch.float64)])
        delta = rewards[b, :n] + gamma * v_next - values[b, :n]
        for t in range(n):  # A_t = sum_k (gamma lam)^k delta_{t+k}
            expected = sum((gamma * lam) ** k * delta[t + k].item() for k in range(n - t))
            assert adv[b, t].item() == pytest.approx(expected, abs=1e-4)
        assert torch.all(adv[b, n:] == 0)
