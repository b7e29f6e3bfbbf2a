"""PPO clip loss, k3 KL and token-sum aggregation against hand-worked numbers and gradient properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.trainer.losses import kl_k3, masked_token_sum, ppo_clip_loss

LN = math.log


def _four_cases():
    """Rows: (A=+1, ratio 1.5) clipped; (A=+1, 0.5) not; (A=-1, 0.5) clipped; (A=-1, 1.5) not.

    Column 1 is masked out and holds an absurd log-ratio (+100) that must not leak into loss or grads.
    """
    old = torch.zeros(4, 2)
    lp = torch.tensor([[LN(1.5), 100.0], [LN(0.5), 100.0], [LN(0.5), 100.0], [LN(1.5), 100.0]], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    mask = torch.tensor([[1.0, 0.0]] * 4)
    return lp, old, adv, mask


def test_ppo_clip_hand_numbers():
    lp, old, adv, mask = _four_cases()
    loss, stats = ppo_clip_loss(lp, old, adv, mask, clip_eps=0.2)
    # -min(1.5*1, 1.2*1) = -1.2 ; -min(0.5, 0.8) = -0.5 ; -min(-0.5, -0.8) = 0.8 ; -min(-1.5, -1.2) = 1.5
    torch.testing.assert_close(loss[:, 0], torch.tensor([-1.2, -0.5, 0.8, 1.5]))
    assert torch.equal(loss[:, 1], torch.zeros(4))
    masked_token_sum(loss, mask).backward()
    # d/dlp of -A*ratio is -A*ratio on unclipped tokens; clipped tokens get exactly zero
    torch.testing.assert_close(lp.grad[:, 0], torch.tensor([0.0, -0.5, 0.0, 1.5]))
    assert torch.equal(lp.grad[:, 1], torch.zeros(4))
    assert stats["clip_frac"].item() == pytest.approx(0.5)
    assert stats["ratio_mean"].item() == pytest.approx(1.0)
    assert stats["ratio_max"].item() == pytest.approx(1.5)
    # approx_kl = mean(r - 1 - ln r): (0.094535 + 0.193147 + 0.193147 + 0.094535) / 4
    assert stats["approx_kl"].item() == pytest.approx(0.143841, abs=1e-6)


def test_ppo_on_policy_is_plain_policy_gradient():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, stats = ppo_clip_loss(lp, lp.detach(), torch.tensor([0.7]), torch.ones(1, 2), 0.2)
    masked_token_sum(loss, torch.ones(1, 2)).backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.7, -0.7]]))
    assert stats["clip_frac"].item() == 0.0 and stats["approx_kl"].item() == 0.0


def test_ppo_bad_shapes():
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3), 0.2)
    with pytest.raises(ValueError, match="same"):
        ppo_clip_loss(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 3), 0.2)


def test_kl_k3_hand_numbers():
    # d = ln(0.25) - ln(0.5) = -ln 2: e^d - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    kl = kl_k3(torch.tensor([[LN(0.5), -3.0]]), torch.tensor([[LN(0.25), -3.0]]))
    torch.testing.assert_close(kl, torch.tensor([[0.193147, 0.0]]), atol=1e-6, rtol=0)


def test_kl_k3_expectation_is_exact_kl():
    # E_{x~p}[k3] = KL(p||q): p = [.5, .5], q = [.25, .75] -> .5 ln 2 + .5 ln(2/3) = 0.143841
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75])
    expectation = (p * kl_k3(p.log(), q.log())).sum()
    assert expectation.item() == pytest.approx(0.143841, abs=1e-6)


def test_masked_token_sum_ignores_masked_nan():
    values = torch.tensor([[1.0, float("nan")], [3.0, 4.0]])
    assert masked_token_sum(values, torch.tensor([[1, 0], [0, 1]])).item() == 5.0


finite = st.floats(-3, 3, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(finite, finite, finite, st.booleans()), min_size=1, max_size=16),
       st.floats(0.05, 0.5))
def test_clipped_tokens_get_zero_gradient(rows, clip_eps):
    lp = torch.tensor([[r[0]] for r in rows], requires_grad=True)
    old = torch.tensor([[r[1]] for r in rows])
    adv = torch.tensor([r[2] for r in rows])
    mask = torch.tensor([[float(r[3])] for r in rows])
    loss, stats = ppo_clip_loss(lp, old, adv, mask, clip_eps)
    masked_token_sum(loss, mask).backward()
    ratio = torch.exp(lp.detach() - old)[:, 0]
    clipped = ((adv > 0) & (ratio > 1 + clip_eps)) | ((adv < 0) & (ratio < 1 - clip_eps))
    on = mask[:, 0].bool()
    assert torch.all(lp.grad[:, 0][clipped | ~on] == 0)
    torch.testing.assert_close(lp.grad[:, 0][~clipped & on], (-adv * ratio)[~clipped & on])
    if on.any():
        assert stats["clip_frac"].item() == pytest.approx(clipped[on].float().mean().item(), abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=16))
def test_k3_is_never_negative(pairs):
    kl = kl_k3(torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs]))
    assert torch.all(kl >= -1e-6)
