"""Policy losses, KL estimators, entropy, value loss and aggregation modes: hand-worked numbers and properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.algorithms.aggregation import LOSS_AGG, aggregate_loss, masked_token_sum
from relayrl.algorithms.kl import KL_ESTIMATORS, kl_abs, kl_k1, kl_k2, kl_k3, kl_loss, kl_penalized_rewards
from relayrl.algorithms.losses import (
    POLICY_LOSSES,
    clip_higher_loss,
    dual_clip_ppo_loss,
    entropy_bonus,
    gspo_loss,
    ppo_clip_loss,
    truncated_is_weights,
)
from relayrl.algorithms.value import value_loss

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
@given(st.lists(st.tuples(finite, finite, finite, st.booleans()), min_size=1, max_size=16), st.floats(0.05, 0.5))
def test_clipped_tokens_get_zero_gradient(rows, clip_eps):
    lp = torch.tensor([[r[0]] for r in rows], requires_grad=True)
    old = torch.tensor([[r[1]] for r in rows])
    adv = torch.tensor([r[2] for r in rows])
    mask = torch.tensor([[float(r[3])] for r in rows])
    loss, stats = ppo_clip_loss(lp, old, adv, mask, clip_eps)
    masked_token_sum(loss, mask).backward()
    assert lp.grad is not None
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


# ------------------------------------------------------------------------- registry, advantage shapes
def test_policy_loss_registry():
    assert {
        "ppo_clip": ppo_clip_loss,
        "dual_clip": dual_clip_ppo_loss,
        "clip_higher": clip_higher_loss,
        "gspo": gspo_loss,
    } == POLICY_LOSSES
    lp = torch.tensor([[-1.0, -2.0]])
    for fn in POLICY_LOSSES.values():  # common call, common stats; on-policy ratio 1 -> loss -A per token
        loss, stats = fn(lp, lp, torch.tensor([0.5]), torch.ones(1, 2))
        torch.testing.assert_close(loss, torch.tensor([[-0.5, -0.5]]))
        assert {"clip_frac", "approx_kl", "ratio_mean", "ratio_max"} <= stats.keys()


def test_per_token_advantages_equal_broadcast_sequence_advantages():
    lp, old, adv, mask = _four_cases()
    seq, _ = ppo_clip_loss(lp, old, adv, mask, 0.2)
    tok, _ = ppo_clip_loss(lp, old, adv.unsqueeze(1).expand(4, 2), mask, 0.2)
    torch.testing.assert_close(seq, tok)
    # per-token advantages differ along a row: A = [2, -1] at ratio 1 -> loss [-2, 1]
    loss, _ = ppo_clip_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[2.0, -1.0]]), torch.ones(1, 2))
    torch.testing.assert_close(loss, torch.tensor([[-2.0, 1.0]]))


# ------------------------------------------------------------------------- clip-higher, dual-clip
def test_clip_higher_hand_numbers():
    # eps_low .2, eps_high .28: ratio range [.8, 1.28]
    #   A=+1, r=1.5 : -min(1.5, 1.28) = -1.28  clipped (grad 0)
    #   A=+1, r=1.25: -min(1.25, 1.25) = -1.25 NOT clipped (symmetric .2 would clip at 1.2); grad -A r = -1.25
    #   A=-1, r=.5  : -min(-.5, -.8) = .8      clipped (grad 0)
    #   A=-1, r=.9  : -min(-.9, -.9) = .9      grad -A r = .9
    lp = torch.tensor([[LN(1.5)], [LN(1.25)], [LN(0.5)], [LN(0.9)]], requires_grad=True)
    loss, stats = clip_higher_loss(
        lp, torch.zeros(4, 1), torch.tensor([1.0, 1.0, -1.0, -1.0]), torch.ones(4, 1), clip_eps=0.2, clip_eps_high=0.28
    )
    torch.testing.assert_close(loss[:, 0], torch.tensor([-1.28, -1.25, 0.8, 0.9]))
    loss.sum().backward()
    assert lp.grad is not None
    torch.testing.assert_close(lp.grad[:, 0], torch.tensor([0.0, -1.25, 0.0, 0.9]))
    assert stats["clip_frac"].item() == pytest.approx(0.5)


def test_dual_clip_hand_numbers():
    # c = 3, eps = .2
    #   A=-1, r=5  : PPO -min(-5, -1.2) = 5, capped at c|A| = 3      grad 0 (dual-clipped)
    #   A=-2, r=2  : PPO -min(-4, -2.4) = 4 <= c|A| = 6 -> 4          grad -A r = 4
    #   A=+1, r=5  : -min(5, 1.2) = -1.2 (no dual clip for A > 0)     grad 0 (clipped)
    #   A=-1, r=.5 : -min(-.5, -.8) = .8                              grad 0 (clipped)
    lp = torch.tensor([[LN(5.0)], [LN(2.0)], [LN(5.0)], [LN(0.5)]], requires_grad=True)
    adv = torch.tensor([-1.0, -2.0, 1.0, -1.0])
    loss, stats = dual_clip_ppo_loss(lp, torch.zeros(4, 1), adv, torch.ones(4, 1), clip_eps=0.2, dual_clip_c=3.0)
    torch.testing.assert_close(loss[:, 0], torch.tensor([3.0, 4.0, -1.2, 0.8]))
    loss.sum().backward()
    assert lp.grad is not None
    torch.testing.assert_close(lp.grad[:, 0], torch.tensor([0.0, 4.0, 0.0, 0.0]))
    assert stats["dual_clip_frac"].item() == pytest.approx(0.25)
    plain, _ = ppo_clip_loss(lp.detach(), torch.zeros(4, 1), adv, torch.ones(4, 1), 0.2)
    assert plain[0, 0].item() == pytest.approx(5.0)  # what the dual clip prevented
    with pytest.raises(ValueError, match="dual_clip_c"):
        dual_clip_ppo_loss(lp, torch.zeros(4, 1), adv, torch.ones(4, 1), dual_clip_c=1.0)


# ------------------------------------------------------------------------- GSPO
def test_gspo_hand_numbers():
    # row 0: token log-ratios .2, -.1 (third masked, log-ratio 100 ignored): s = exp(.05) = 1.051271;
    #   A = +1 and s > 1 + 4e-4 -> every token clipped: loss -1.0004, no gradient for the whole sequence
    # row 1: log-ratios .0002, -.0002, .0003: s = exp(.0001) = 1.000100 inside [.9997, 1.0004];
    #   A = -2 -> loss_t = 2 s = 2.000200 each; d loss_t / d logprob_t = -A s = 2.000200
    old = torch.zeros(2, 3)
    lp = torch.tensor([[0.2, -0.1, 100.0], [0.0002, -0.0002, 0.0003]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, stats = gspo_loss(lp, old.double(), torch.tensor([1.0, -2.0]), mask)
    torch.testing.assert_close(
        loss, torch.tensor([[-1.0004, -1.0004, 0.0], [2.0002, 2.0002, 2.0002]], dtype=torch.float64), atol=1e-6, rtol=0
    )
    loss.sum().backward()
    torch.testing.assert_close(
        lp.grad, torch.tensor([[0.0, 0.0, 0.0], [2.0002] * 3], dtype=torch.float64), atol=1e-6, rtol=0
    )
    assert stats["clip_frac"].item() == pytest.approx(0.4)  # 2 of 5 masked tokens (row 0's)
    assert stats["ratio_max"].item() == pytest.approx(1.051271, abs=1e-6)


def _gspo_reference(lp, old, adv, mask, eps_low, eps_high):
    """The paper's sequence objective, differentiated through s_i directly: mean_i -min(s_i A_i, clip(s_i) A_i)."""
    m = mask.double()
    s = torch.exp(((lp - old) * m).sum(1) / m.sum(1))
    return -torch.minimum(s * adv, torch.clamp(s, 1 - eps_low, 1 + eps_high) * adv).mean()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.floats(-0.01, 0.01), min_size=1, max_size=5), finite), min_size=1, max_size=6))
def test_gspo_gradient_is_the_sequence_objectives(rows):
    T = max(len(r) for r, _ in rows)
    lr = torch.tensor([r + [0.0] * (T - len(r)) for r, _ in rows], dtype=torch.float64)
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r, _ in rows])
    adv = torch.tensor([a for _, a in rows], dtype=torch.float64)
    old = -torch.rand(lr.shape, dtype=torch.float64)
    lp1, lp2 = (old + lr).requires_grad_(), (old + lr).requires_grad_()
    loss, _ = gspo_loss(lp1, old, adv, mask, clip_eps=3e-3, clip_eps_high=4e-3)
    aggregate_loss(loss, mask, "seq-mean-token-mean").backward()
    _gspo_reference(lp2, old, adv, mask, 3e-3, 4e-3).backward()
    torch.testing.assert_close(lp1.grad, lp2.grad, atol=1e-9, rtol=1e-6)


# ------------------------------------------------------------------------- truncated importance weights
def test_truncated_is_weights_token_and_sequence():
    # old - behaviour = ln .5, ln 3, ln 1.5 (4th masked): token w = .5, min(3, 2) = 2, 1.5
    # sequence: exp(ln .5 + ln 3 + ln 1.5) = 2.25 -> min(2.25, 2) = 2 on every token; with C = 3: 2.25
    old = torch.zeros(1, 4)
    beh = -torch.tensor([[LN(0.5), LN(3.0), LN(1.5), 50.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    torch.testing.assert_close(truncated_is_weights(old, beh, mask, 2.0), torch.tensor([[0.5, 2.0, 1.5, 0.0]]))
    torch.testing.assert_close(
        truncated_is_weights(old, beh, mask, 2.0, "sequence"), torch.tensor([[2.0, 2.0, 2.0, 0.0]])
    )
    torch.testing.assert_close(
        truncated_is_weights(old, beh, mask, 3.0, "sequence"), torch.tensor([[2.25, 2.25, 2.25, 0.0]])
    )
    with pytest.raises(ValueError, match="is_level"):
        truncated_is_weights(old, beh, mask, 2.0, "tokens")


def test_is_weights_multiply_the_policy_loss():
    # on-policy w.r.t. pi_old (ratio 1), A = 1: loss_t = -w_t = -.5, -2, -1.5 ; gradient -w_t (w is constant)
    old = torch.zeros(1, 3)
    beh = -torch.tensor([[LN(0.5), LN(3.0), LN(1.5)]])
    lp = torch.zeros(1, 3, requires_grad=True)
    loss, stats = ppo_clip_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 3), 0.2, behaviour_logprobs=beh)
    torch.testing.assert_close(loss, torch.tensor([[-0.5, -2.0, -1.5]]))
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.5, -2.0, -1.5]]))
    assert stats["is_weight_mean"].item() == pytest.approx(4 / 3)  # (.5 + 2 + 1.5) / 3
    assert stats["is_trunc_frac"].item() == pytest.approx(1 / 3)


# ------------------------------------------------------------------------- KL estimators
def test_kl_abs_hand_numbers_and_gradient():
    # log pi = ln .5, ln .25, ln .1 ; log pi_ref = ln .25, ln .5, ln .1
    # k1 = ln 2, -ln 2, 0 (mean 0: the two tokens cancel) ; |k1| = .693147, .693147, 0 (mean .462098)
    lp = torch.tensor([[LN(0.5), LN(0.25), LN(0.1)]], requires_grad=True)
    ref = torch.tensor([[LN(0.25), LN(0.5), LN(0.1)]])
    torch.testing.assert_close(kl_k1(lp, ref).detach(), torch.tensor([[0.693147, -0.693147, 0.0]]))
    torch.testing.assert_close(kl_abs(lp, ref).detach(), torch.tensor([[0.693147, 0.693147, 0.0]]))
    # as a loss (coef 2): d/dlogprob = 2 sign(log pi - log pi_ref): +2 lowers the first token, -2 raises the
    # second; the third sits on the reference (|x| has gradient 0 at 0 in torch)
    loss, stats = kl_loss(lp, ref, torch.ones(1, 3), coef=2.0, estimator="abs")
    assert stats["kl"].item() == pytest.approx(2 * LN(2) / 3)
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[2.0, -2.0, 0.0]]))


def test_kl_registry_and_k1_k2_hand_numbers():
    assert {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "abs": kl_abs} == KL_ESTIMATORS
    # log pi = ln .5, log pi_ref = ln .25: k1 = ln 2 = .693147 ; k2 = (ln 2)^2 / 2 = .240227
    lp, ref = torch.tensor([LN(0.5)]), torch.tensor([LN(0.25)])
    assert kl_k1(lp, ref).item() == pytest.approx(0.693147, abs=1e-6)
    assert kl_k2(lp, ref).item() == pytest.approx(0.240227, abs=1e-6)
    # expectations over x ~ p = [.5, .5], q = [.25, .75]: E[k1] = KL = .143841 (unbiased);
    # E[k2] = (.5 (ln 2)^2 + .5 (ln 2/3)^2) / 2 = (.240227 + .082201) / 2 = .161214 (biased)
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75])
    assert (p * kl_k1(p.log(), q.log())).sum().item() == pytest.approx(0.143841, abs=1e-6)
    assert (p * kl_k2(p.log(), q.log())).sum().item() == pytest.approx(0.161214, abs=1e-6)


def test_k2_loss_gradient_is_the_kl_gradient_k1_is_zero():
    """E_{x~pi}[grad k(x)] for pi = softmax(theta): k2 gives grad KL(pi || q) exactly, k1 gives 0."""
    q = torch.tensor([0.2, 0.3, 0.5])
    theta = torch.tensor([0.3, -0.2, 0.1], requires_grad=True)
    logp = torch.log_softmax(theta, 0)
    (true_grad,) = torch.autograd.grad((logp.exp() * (logp - q.log())).sum(), theta)
    expected = {}
    for name in ("k1", "k2"):
        logp = torch.log_softmax(theta, 0)
        (expected[name],) = torch.autograd.grad((logp.exp().detach() * KL_ESTIMATORS[name](logp, q.log())).sum(), theta)
    torch.testing.assert_close(expected["k2"], true_grad)
    torch.testing.assert_close(expected["k1"], torch.zeros(3), atol=1e-7, rtol=0)
    assert true_grad.abs().max() > 0.05


def test_kl_loss_and_reward_penalty():
    # k1 per token: [ln 2, 0, (masked)]; coef .1
    lp = torch.tensor([[LN(0.5), LN(0.5), 3.0]])
    ref = torch.tensor([[LN(0.25), LN(0.5), -9.0]])
    mask = torch.tensor([[1, 1, 0]])
    rewards, kl = kl_penalized_rewards(torch.tensor([[0.0, 1.0, 5.0]]), lp, ref, mask, coef=0.1)
    torch.testing.assert_close(rewards, torch.tensor([[-0.0693147, 1.0, 0.0]]))  # r - .1 * ln 2 ; 1 - 0
    torch.testing.assert_close(kl, torch.tensor([[0.693147, 0.0, 0.0]]))
    # as a loss (k3 default): .1 * .193147 on token 0 (see test_kl_k3_hand_numbers), mean kl .193147 / 2
    loss, stats = kl_loss(lp, ref, mask, coef=0.1)
    torch.testing.assert_close(loss, torch.tensor([[0.0193147, 0.0, 0.0]]))
    assert stats["kl"].item() == pytest.approx(0.0965736, abs=1e-6)
    with pytest.raises(ValueError, match="k4"):
        kl_loss(lp, ref, mask, 0.1, estimator="k4")


# ------------------------------------------------------------------------- entropy, value
def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - sum_v p_v z_v, differentiable: [B, T, V] -> [B, T]."""
    return torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)


def test_entropy_bonus_hand_numbers_and_gradient():
    # uniform over 4: H = ln 4 = 1.386294, loss = -.01 H; gradient 0 at the maximum
    logits = torch.zeros(1, 1, 4, requires_grad=True)
    loss, stats = entropy_bonus(_entropy(logits), torch.ones(1, 1), coef=0.01)
    assert loss.item() == pytest.approx(-0.01386294, abs=1e-7)
    assert stats["entropy"].item() == pytest.approx(1.386294, abs=1e-6)
    loss.sum().backward()
    assert logits.grad.abs().max() < 1e-7
    # p = [.75, .25] (z = [ln 3, 0]): H = .562335; dH/dz_i = -p_i (ln p_i + H) = [-.205990, .205990];
    # loss = -H -> gradient [.205990, -.205990]: descent lowers the likely logit, flattening p
    logits = torch.tensor([[[LN(3.0), 0.0]]], requires_grad=True)
    loss, stats = entropy_bonus(_entropy(logits), torch.ones(1, 1), coef=1.0)
    assert stats["entropy"].item() == pytest.approx(0.562335, abs=1e-6)
    loss.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[[0.205990, -0.205990]]]), atol=1e-6, rtol=0)


def test_value_loss_hand_numbers():
    # clip .2, mask 1,1,1,1,0
    #   V=1,  old .5, R=2: (1-2)^2 = 1 ; V_clip = .5+.2 = .7 -> (.7-2)^2 = 1.69 -> .5*1.69 = .845, clipped, grad 0
    #   V=1,  old .9, R=0: within the clip, both terms 1 -> .5 ; grad V - R = 1
    #   V=0,  old 0,  R=1: .5 ; grad -1
    #   V=0,  old .5, R=2: moving away from R: (0-2)^2 = 4 > (.3-2)^2 = 2.89 -> 2 ; grad V - R = -2
    #   masked (V=5) -> 0
    values = torch.tensor([[1.0, 1.0, 0.0, 0.0, 5.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.9, 0.0, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 1.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, stats = value_loss(values, old, returns, mask, clip=0.2)
    torch.testing.assert_close(loss, torch.tensor([[0.845, 0.5, 0.5, 2.0, 0.0]]))
    loss.sum().backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 1.0, -1.0, -2.0, 0.0]]))
    assert stats["vf_clip_frac"].item() == pytest.approx(0.25)
    # R = 2,0,1,2 (var .6875), R - V = 1,-1,1,2 (var 1.1875): explained variance 1 - 1.1875/.6875 = -.727273
    assert stats["explained_var"].item() == pytest.approx(-0.727273, abs=1e-6)
    plain, _ = value_loss(values.detach(), old, returns, mask, clip=None)
    torch.testing.assert_close(plain, torch.tensor([[0.5, 0.5, 0.5, 2.0, 0.0]]))


# ------------------------------------------------------------------------- aggregation
def test_aggregation_modes_hand_numbers():
    # row 0: 3 tokens 1,2,3 ; row 1: 1 token 4 ; row 2: padding (no tokens, garbage 9 ignored)
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(2.5)  # 10 / 4 tokens
    assert aggregate_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(5.0)  # (6 + 4) / 2 seqs
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)  # (2 + 4) / 2
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", max_len=5).item() == pytest.approx(1.0)  # 10/(2*5)
    assert set(LOSS_AGG) == {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    assert aggregate_loss(loss, torch.zeros(3, 3), "token-mean").item() == 0.0
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(loss, mask, "mean")


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.lists(finite, min_size=0, max_size=6), st.integers(1, 3)), min_size=1, max_size=8),
    st.sampled_from(sorted(LOSS_AGG)),
)
def test_aggregation_is_invariant_to_micro_batching(rows, mode):
    """Summing numerators and denominators over any row split gives the whole batch's loss."""
    T = max(1, max(len(r) for r, _ in rows))
    loss = torch.tensor([r + [50.0] * (T - len(r)) for r, _ in rows], dtype=torch.float64)
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r, _ in rows])
    kw = {"max_len": 8} if mode == "seq-mean-token-sum-norm" else {}
    parts, start = [], 0
    for _, size in rows:  # micro-batches of the drawn sizes
        if start < len(rows):
            parts.append(LOSS_AGG[mode](loss[start : start + size], mask[start : start + size], **kw))
            start += size
    num, den = sum(p[0] for p in parts), sum(p[1] for p in parts)
    whole = aggregate_loss(loss, mask, mode, **kw)
    assert (num / den if den > 0 else torch.tensor(0.0)).item() == pytest.approx(whole.item(), abs=1e-9)


# ------------------------------------------------------------------------- clip properties for every variant
@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(finite, finite, finite), min_size=1, max_size=16),
    st.floats(0.05, 0.4),
    st.floats(0.05, 0.4),
    st.floats(1.5, 5.0),
)
def test_asymmetric_and_dual_clip_zero_gradient_and_bound(rows, eps_low, eps_high, c):
    old = torch.tensor([[r[1]] for r in rows])
    adv = torch.tensor([r[2] for r in rows])
    ratio = torch.exp(torch.tensor([r[0] for r in rows]) - old[:, 0])
    clipped = ((adv > 0) & (ratio > 1 + eps_high)) | ((adv < 0) & (ratio < 1 - eps_low))
    dual = (adv < 0) & (ratio > c)
    for fn, kw, frozen in ((clip_higher_loss, {}, clipped), (dual_clip_ppo_loss, {"dual_clip_c": c}, clipped | dual)):
        lp = torch.tensor([[r[0]] for r in rows], requires_grad=True)
        loss, _ = fn(lp, old, adv, torch.ones(len(rows), 1), clip_eps=eps_low, clip_eps_high=eps_high, **kw)
        loss.sum().backward()
        assert lp.grad is not None
        assert torch.all(lp.grad[:, 0][frozen] == 0)
        torch.testing.assert_close(lp.grad[:, 0][~frozen], (-adv * ratio)[~frozen])
        if fn is dual_clip_ppo_loss:  # A < 0: the loss never exceeds c |A|
            assert torch.all(loss[:, 0][adv < 0] <= c * adv[adv < 0].abs() + 1e-5)
