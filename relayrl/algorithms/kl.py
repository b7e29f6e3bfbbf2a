"""KL(pi || pi_ref) per token: the estimators, and their two uses (a loss term or a reward penalty).

- ``KL_ESTIMATORS``: ``fn(logprobs, ref_logprobs) -> kl[B, T]``, used as a loss term (``kl_loss``) or as a
  reward penalty (``kl_penalized_rewards``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from relayrl.algorithms.aggregation import Stats, check_same_shape, masked_mean


# ---------------------------------------------------------------------------------------- KL
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = ``log pi(x) - log pi_ref(x)``: unbiased for KL(pi || pi_ref) on x ~ pi, high variance, can be < 0.

    Schulman, "Approximating KL Divergence", 2020 (http://joschu.net/blog/kl-approx.html). The classic
    RLHF *reward penalty* (Ziegler et al. 2019, arXiv:1909.08593; InstructGPT): summed along the sequence
    it is exactly the log-likelihood ratio of the sample. As a *loss* its gradient ``grad log pi`` has
    expectation zero, so it does not pull pi towards pi_ref. [B, T] -> [B, T].
    """
    return logprobs - ref_logprobs


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = ``(log pi(x) - log pi_ref(x))^2 / 2``: biased but low variance, never negative (Schulman 2020).

    As a *loss*, its gradient ``(log pi - log pi_ref) grad log pi`` is, in expectation over x ~ pi, exactly
    the gradient of KL(pi || pi_ref) (Tang & Munos 2025, arXiv:2506.09477): the estimator to pick when the
    KL term is differentiated. [B, T] -> [B, T].
    """
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref) per token, for tokens sampled from pi.

    With ``d = log pi_ref(x) - log pi(x)``: ``k3 = exp(d) - d - 1`` (J. Schulman, "Approximating KL
    Divergence", 2020, http://joschu.net/blog/kl-approx.html). It is unbiased (E_pi[exp(d)] = 1), and
    never negative (e^d >= 1 + d), unlike k1 = -d. GRPO uses it as its KL penalty (DeepSeekMath eq. 4).
    Shapes: [B, T] -> [B, T].
    """
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1.0


def kl_abs(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """|k1| = ``|log pi(x) - log pi_ref(x)|``: k1 made non-negative, so a token's estimate can't cancel
    another's in the mean (verl's ``kl_penalty="abs"``). Biased: E|k1| >= |E k1| = KL. As a loss, its
    gradient ``sign(log pi - log pi_ref) grad log pi`` moves each sampled token's logprob towards the
    reference's at a rate independent of the gap, unlike k1's mean-zero gradient. [B, T] -> [B, T].
    """
    return (logprobs - ref_logprobs).abs()


KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

KL_ESTIMATORS: dict[str, KLFn] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "abs": kl_abs}
"""Per-token estimators of KL(pi || pi_ref) by name: ``fn(logprobs[B, T], ref_logprobs[B, T]) -> [B, T]``."""


def _kl_estimator(name: str) -> KLFn:
    if name not in KL_ESTIMATORS:
        raise ValueError(f"KL estimator {name!r} is not known; use one of {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[name]


def kl_loss(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, loss_mask: torch.Tensor, coef: float, estimator: str = "k3"
) -> tuple[torch.Tensor, Stats]:
    """KL as a loss term: ``coef * k(logprobs, ref_logprobs)`` per token, added to the policy loss.

    GRPO's choice (DeepSeekMath eq. 3-4, k3). Returns (loss [B, T] zero off the mask, {"kl": masked mean}).
    """
    check_same_shape(loss_mask, logprobs=logprobs, ref_logprobs=ref_logprobs)
    kl = _kl_estimator(estimator)(logprobs, ref_logprobs)
    mask = loss_mask.bool()
    return torch.where(mask, coef * kl, torch.zeros_like(kl)), {"kl": masked_mean(kl.detach(), mask)}


@torch.no_grad()
def kl_penalized_rewards(
    rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    coef: float,
    estimator: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL as a reward penalty: ``r_t - coef * k(logprobs_t, ref_logprobs_t)`` on every completion token.

    The PPO-RLHF form (Ziegler et al. 2019, arXiv:1909.08593; Ouyang et al. 2022, arXiv:2203.02155, eq. 2)
    and REINFORCE++'s: the penalty becomes part of the return, so GAE or the return-to-go spreads it over
    earlier tokens, and no gradient flows through it (evaluate ``logprobs`` with the behaviour/old policy).
    rewards, logprobs, ref_logprobs, loss_mask: [B, T] (rewards e.g. from ``advantages.last_token_rewards``).
    Returns (penalised rewards [B, T], kl [B, T]), both zero off the mask.
    """
    check_same_shape(loss_mask, rewards=rewards, logprobs=logprobs, ref_logprobs=ref_logprobs)
    kl = _kl_estimator(estimator)(logprobs, ref_logprobs)
    mask = loss_mask.bool()
    zero = torch.zeros_like(kl)
    return torch.where(mask, rewards - coef * kl, zero), torch.where(mask, kl, zero)
