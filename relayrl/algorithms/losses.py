"""Losses: per-token tensors in, per-token losses and scalar stats out; plus how to aggregate them.

Shapes: ``[B, T]`` is batch x token positions (the trainer passes next-token positions, ``T = L-1``),
``loss_mask[B, T]`` is 1 on completion tokens. Every function is pure and returns *per-token* losses,
zero off the mask; turning them into one scalar is a separate, registered choice (``LOSS_AGG``) because
it must be made over the whole step, across micro-batches and data-parallel ranks.

Registries (one dict each, all in this file):

- ``POLICY_LOSSES``: ``fn(logprobs, old_logprobs, advantages, loss_mask, **hyper, behaviour_logprobs=None,
  is_cap=2.0, is_level="token") -> (loss[B, T], stats)``. ``advantages`` is [B] (one per sequence,
  broadcast over its tokens) or [B, T] (per token, e.g. GAE). ``hyper``: ``ppo_clip``: clip_eps;
  ``dual_clip``: clip_eps, dual_clip_c, clip_eps_high; ``clip_higher`` and ``gspo``: clip_eps, clip_eps_high.
  Stats always hold clip_frac, approx_kl, ratio_mean, ratio_max (masked-token means / max).
- ``KL_ESTIMATORS``: ``fn(logprobs, ref_logprobs) -> kl[B, T]``, used as a loss term (``kl_loss``) or as a
  reward penalty (``kl_penalized_rewards``).
- ``LOSS_AGG``: ``fn(loss[B, T], loss_mask[B, T], **kw) -> (numerator, denominator)``, both additive over
  micro-batches and ranks; the step's loss is ``sum(numerators) / sum(denominators)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

Stats = dict[str, torch.Tensor]


# ---------------------------------------------------------------------------------------- helpers
def masked_token_sum(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values[B, T]`` over positions where ``loss_mask`` is set; a scalar.

    The trainer divides this by the number of completion tokens in the *whole step* (all micro-batches,
    all ranks), giving the token-level mean of DAPO (Yu et al. 2025, arXiv:2503.14476, sec. 3.3) and
    Dr.GRPO: every token weighs the same, whatever the length of its sequence or how the batch was split.
    """
    return torch.where(loss_mask.bool(), values, torch.zeros_like(values)).sum()


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_token_sum(values, mask) / mask.sum().clamp(min=1)


def _masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.bool()
    return torch.where(m, values, torch.zeros_like(values)).max() if m.any() else values.new_zeros(())


def _check_same_shape(loss_mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    if loss_mask.ndim != 2 or any(t.shape != loss_mask.shape for t in tensors.values()):
        shapes = ", ".join(f"{k} {tuple(t.shape)}" for k, t in tensors.items())
        raise ValueError(f"{shapes} and loss_mask {tuple(loss_mask.shape)} must have the same [B, T] shape")


def _token_advantages(advantages: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """[B] -> [B, 1] (one per sequence, broadcast over tokens) or [B, T] as is."""
    if advantages.shape == shape[:1]:
        return advantages.unsqueeze(1).to(dtype)
    if advantages.shape == shape:
        return advantages.to(dtype)
    raise ValueError(
        f"advantages {tuple(advantages.shape)} must be [B]={shape[0]} (one per sequence) or "
        f"[B, T]={tuple(shape)} (one per token)"
    )


# ---------------------------------------------------------------------------------------- off-policy
def truncated_is_weights(
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    cap: float = 2.0,
    level: str = "token",
) -> torch.Tensor:
    """Truncated importance weights ``w = min(pi_old / mu, C)`` correcting for the behaviour policy ``mu``.

        token:    w_t = min(exp(old_t - mu_t), C)
        sequence: w   = min(exp(sum_t (old_t - mu_t)), C)      the same weight on every token of the row

    In async training the tokens were sampled by an engine whose weights (``mu``, its reported logprobs)
    lag the trainer's ``pi_old``; PPO's ratio ``pi / pi_old`` then measures only the trust region, and ``w``
    restores the expectation under ``mu`` (decoupled PPO: Hilton et al. 2021, arXiv:2110.00641; AReaL, Fu
    et al. 2025, arXiv:2505.24298). Truncation at ``C`` bounds the variance at the price of a small bias
    (IMPALA's rho-bar, Espeholt et al. 2018, arXiv:1802.01561). Sequence level is the exact weight of the
    whole sample but its variance grows with length. Computed in log space (no overflow); no gradient.
    Returns [B, T], zero off the mask.
    """
    _check_same_shape(loss_mask, old_logprobs=old_logprobs, behaviour_logprobs=behaviour_logprobs)
    if cap <= 0:
        raise ValueError(f"is_cap={cap} must be > 0; 2.0 is common (C in w = min(pi_old / mu, C))")
    mask = loss_mask.bool()
    log_w = torch.where(mask, old_logprobs - behaviour_logprobs, torch.zeros_like(old_logprobs)).detach()
    if level == "sequence":
        log_w = log_w.sum(dim=1, keepdim=True).expand_as(log_w)
    elif level != "token":
        raise ValueError(f"is_level={level!r} is not known; use 'token' or 'sequence'")
    w = torch.exp(torch.clamp(log_w, max=math.log(cap)))
    return torch.where(mask, w, torch.zeros_like(w))


# ---------------------------------------------------------------------------------------- policy losses
def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, dual_clip_c: float | None
) -> tuple[torch.Tensor, Stats]:
    """``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``, bounded by ``-c A`` for ``A < 0`` if dual-clipped."""
    loss = -torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)
    with torch.no_grad():
        flags = {"clip": ((adv > 0) & (ratio > 1.0 + eps_high)) | ((adv < 0) & (ratio < 1.0 - eps_low))}
    if dual_clip_c is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip_c * adv), loss)
        flags["dual_clip"] = ((adv < 0) & (ratio > dual_clip_c)).detach()
    return loss, flags


def _policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None = None,
    sequence_ratio: bool = False,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float = 2.0,
    is_level: str = "token",
) -> tuple[torch.Tensor, Stats]:
    """Shared body of every ``POLICY_LOSSES`` entry: ratio, clipped surrogate, optional IS weight, stats."""
    _check_same_shape(loss_mask, logprobs=logprobs, old_logprobs=old_logprobs)
    if eps_low <= 0 or eps_high <= 0:
        raise ValueError(f"clip_eps={eps_low} and clip_eps_high={eps_high} must be > 0; PPO uses 0.2")
    mask = loss_mask.bool()
    # Zero log-ratio off the mask: padding positions then can't overflow exp() and poison gradients.
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    if sequence_ratio:  # GSPO-token: value exp(mean_t log-ratio), gradient d/dlogprob_t = that value
        seq = log_ratio.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
        log_ratio = torch.where(mask, logprobs - logprobs.detach(), torch.zeros_like(logprobs)) + seq.detach()
    ratio = torch.exp(log_ratio)
    loss, flags = _clipped_surrogate(
        ratio, _token_advantages(advantages, ratio.shape, ratio.dtype), eps_low, eps_high, dual_clip_c
    )
    stats: Stats = {}
    if behaviour_logprobs is not None:
        w = truncated_is_weights(old_logprobs, behaviour_logprobs, loss_mask, is_cap, is_level)
        loss = loss * w
        truncated = (w >= is_cap * (1 - 1e-6)).to(w.dtype)
        stats.update(is_weight_mean=_masked_mean(w, mask), is_trunc_frac=_masked_mean(truncated, mask))
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    with torch.no_grad():
        stats.update(
            clip_frac=_masked_mean(flags["clip"].to(ratio.dtype), mask),
            approx_kl=_masked_mean(kl_k3(old_logprobs, logprobs), mask),
            ratio_mean=_masked_mean(ratio, mask),
            ratio_max=_masked_max(ratio, mask),
        )
        if "dual_clip" in flags:
            stats["dual_clip_frac"] = _masked_mean(flags["dual_clip"].to(ratio.dtype), mask)
    return loss, stats


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float = 0.2,
    *,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float = 2.0,
    is_level: str = "token",
) -> tuple[torch.Tensor, Stats]:
    """PPO's clipped surrogate, per token (Schulman et al. 2017, arXiv:1707.06347, eq. 7), negated to a loss.

        ratio = exp(logprobs - old_logprobs)
        loss  = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)          (* w if behaviour_logprobs)

    Where the clipped term is the minimum (A > 0 and ratio > 1+eps, or A < 0 and ratio < 1-eps) the loss
    is constant in ``logprobs``, so those tokens get no gradient: the update stops pushing a token that has
    already moved far enough. ``w`` is ``truncated_is_weights(old, behaviour, ...)`` for off-policy data.

    logprobs, old_logprobs, loss_mask: [B, T]; advantages: [B] or [B, T]. Returns (loss [B, T], zero off
    the mask; stats over masked tokens: clip_frac, approx_kl = mean k3 of KL(pi_old || pi), ratio_mean,
    ratio_max, and is_weight_mean, is_trunc_frac when behaviour_logprobs is given).
    """
    return _policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        clip_eps,
        clip_eps,
        behaviour_logprobs=behaviour_logprobs,
        is_cap=is_cap,
        is_level=is_level,
    )


def dual_clip_ppo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float = 0.2,
    dual_clip_c: float = 3.0,
    clip_eps_high: float | None = None,
    *,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float = 2.0,
    is_level: str = "token",
) -> tuple[torch.Tensor, Stats]:
    """Dual-clip PPO (Ye et al. 2020, *Mastering Complex Control in MOBA Games*, arXiv:1912.09729).

        loss = -min(r A, clip(r, 1 - eps, 1 + eps_high) A)              A >= 0
        loss = min(-min(r A, clip(r, ...) A), -c A)  <=  c |A|          A <  0

    With A < 0 PPO's loss ``-r A = r |A|`` grows without bound in the ratio: one token that became far
    more likely than under pi_old (off-policy data, a stale sample) can dominate the step. The second clip
    caps it at ``c |A|`` (c = 3 in the paper) and gives ratios above c no gradient. ``clip_eps_high``
    defaults to ``clip_eps``. Shapes, stats and the IS hook as ``ppo_clip_loss``; stats add dual_clip_frac.
    """
    if dual_clip_c <= 1.0:
        raise ValueError(
            f"dual_clip_c={dual_clip_c} must be > 1 (it caps the loss at c|A| for A < 0); the paper uses 3"
        )
    return _policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        clip_eps,
        clip_eps if clip_eps_high is None else clip_eps_high,
        dual_clip_c=dual_clip_c,
        behaviour_logprobs=behaviour_logprobs,
        is_cap=is_cap,
        is_level=is_level,
    )


def clip_higher_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float = 0.28,
    *,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float = 2.0,
    is_level: str = "token",
) -> tuple[torch.Tensor, Stats]:
    """DAPO's clip-higher: ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`` with eps_high > eps_low.

    Yu et al. 2025, *DAPO*, arXiv:2503.14476, sec. 3.1 (eps_low = 0.2, eps_high = 0.28). A symmetric clip
    lets a likely token (p = 0.9) rise to 1 but an unlikely one (p = 0.01) only to 0.012, so exploration
    tokens can barely gain mass and entropy collapses; a higher upper bound leaves them room. Shapes,
    stats and the IS hook as ``ppo_clip_loss``.
    """
    return _policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        clip_eps,
        clip_eps_high,
        behaviour_logprobs=behaviour_logprobs,
        is_cap=is_cap,
        is_level=is_level,
    )


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float = 3e-4,
    clip_eps_high: float = 4e-4,
    *,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float = 2.0,
    is_level: str = "token",
) -> tuple[torch.Tensor, Stats]:
    """GSPO: the ratio and its clip at sequence level (Zheng et al. 2025, arXiv:2507.18071).

        s_i     = (pi(y_i) / pi_old(y_i))^(1/|y_i|) = exp(mean_t (logprobs - old_logprobs))
        s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]          (GSPO-token: value s_i, d/dlogprob_t = s_i)
        loss_t  = -min(s_{i,t} A_t, clip(s_{i,t}, 1 - eps_low, 1 + eps_high) A_t)

    Token ratios are noisy single-sample weights; one ratio per sequence matches the sequence-level reward
    and keeps MoE training stable. With [B] advantages and ``seq-mean-token-mean`` aggregation the gradient
    is exactly GSPO's ``-(1/|y_i|) s_i A_i sum_t grad logprob_t`` per sequence; the clip range is tiny
    (3e-4, 4e-4 in the paper) because s_i is a per-token geometric mean. Clipping zeroes a whole
    sequence's gradient. Shapes, stats and the IS hook as ``ppo_clip_loss``.
    """
    return _policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        clip_eps,
        clip_eps_high,
        sequence_ratio=True,
        behaviour_logprobs=behaviour_logprobs,
        is_cap=is_cap,
        is_level=is_level,
    )


PolicyLossFn = Callable[..., tuple[torch.Tensor, Stats]]

POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "ppo_clip": ppo_clip_loss,
    "dual_clip": dual_clip_ppo_loss,
    "clip_higher": clip_higher_loss,
    "gspo": gspo_loss,
}
"""Policy losses by name: ``fn(logprobs, old_logprobs, advantages, loss_mask, **hyper) -> (loss[B, T], stats)``."""


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
    _check_same_shape(loss_mask, logprobs=logprobs, ref_logprobs=ref_logprobs)
    kl = _kl_estimator(estimator)(logprobs, ref_logprobs)
    mask = loss_mask.bool()
    return torch.where(mask, coef * kl, torch.zeros_like(kl)), {"kl": _masked_mean(kl.detach(), mask)}


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
    _check_same_shape(loss_mask, rewards=rewards, logprobs=logprobs, ref_logprobs=ref_logprobs)
    kl = _kl_estimator(estimator)(logprobs, ref_logprobs)
    mask = loss_mask.bool()
    zero = torch.zeros_like(kl)
    return torch.where(mask, rewards - coef * kl, zero), torch.where(mask, kl, zero)


# ---------------------------------------------------------------------------------------- entropy, value
def entropy_bonus(logits: torch.Tensor, loss_mask: torch.Tensor, coef: float) -> tuple[torch.Tensor, Stats]:
    """Entropy bonus ``-coef * H_t`` per token, ``H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_{t,v}``.

    Adding it to the loss rewards a flatter next-token distribution (PPO, arXiv:1707.06347, eq. 9), the
    usual guard against entropy collapse. Differentiable, unlike ``logprobs.token_entropy`` (monitoring).
    logits: [B, T, V], already aligned with ``loss_mask`` [B, T] and divided by the sampling temperature.
    Returns (loss [B, T] zero off the mask, {"entropy": masked mean}).
    """
    if logits.ndim != 3 or logits.shape[:2] != loss_mask.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be [B, T, V] with [B, T] = loss_mask "
            f"{tuple(loss_mask.shape)}; slice them to the scored positions first"
        )
    z = logits.float()
    entropy = torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)
    mask = loss_mask.bool()
    loss = torch.where(mask, -coef * entropy, torch.zeros_like(entropy))
    return loss, {"entropy": _masked_mean(entropy.detach(), mask)}


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float | None = 0.2
) -> tuple[torch.Tensor, Stats]:
    """PPO critic loss with value clipping (the PPO2 baseline implementation; Engstrom et al. 2020,
    *Implementation Matters*, arXiv:2005.12729), per token:

        V_clip = V_old + clip(V - V_old, -c, c)
        loss   = 0.5 * max((V - R)^2, (V_clip - R)^2)

    The max makes the loss pessimistic: once V has moved more than ``c`` from ``V_old`` towards ``R`` the
    clipped term dominates and is constant in V, so the critic can't jump on one batch (the trust region
    of the policy clip, for the value). ``clip=None`` or 0 gives plain ``0.5 (V - R)^2``. Returns (loss
    [B, T] zero off the mask, stats: vf_clip_frac (tokens where the clipped term is larger), value_mean,
    return_mean, explained_var = 1 - Var(R - V) / Var(R)). Aggregate with ``LOSS_AGG`` like policy losses.
    """
    _check_same_shape(mask, values=values, old_values=old_values, returns=returns)
    m = mask.bool()
    unclipped = (values - returns) ** 2
    if clip:
        clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (clipped_values - returns) ** 2
        loss = 0.5 * torch.maximum(unclipped, clipped)
        clip_frac = _masked_mean((clipped > unclipped).to(values.dtype), m)
    else:
        loss, clip_frac = 0.5 * unclipped, values.new_zeros(())
    with torch.no_grad():
        ret_var = _masked_mean((returns - _masked_mean(returns, m)) ** 2, m)
        err = returns - values
        err_var = _masked_mean((err - _masked_mean(err, m)) ** 2, m)
        stats = {
            "vf_clip_frac": clip_frac.detach(),
            "value_mean": _masked_mean(values.detach(), m),
            "return_mean": _masked_mean(returns, m),
            "explained_var": 1.0 - err_var.detach() / ret_var.clamp(min=1e-8),
        }
    return torch.where(m, loss, torch.zeros_like(loss)), stats


# ---------------------------------------------------------------------------------------- aggregation
def _row_has_tokens(mask: torch.Tensor) -> torch.Tensor:
    return mask.bool().any(dim=1)


def agg_token_mean(loss: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """token-mean: ``sum_{i,t} l_{i,t} / sum_i |y_i|``; every token weighs the same (DAPO sec. 3.3).

    Micro-batching / data parallel: the denominator is the step's *total* token count over all
    micro-batches and ranks (all-reduce it before the first backward); averaging per-micro-batch means
    instead re-weights tokens by how the batch happened to be split.
    """
    return masked_token_sum(loss, loss_mask), loss_mask.bool().sum().to(loss.dtype)


def agg_seq_mean_token_sum(loss: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """seq-mean-token-sum: ``(1/B) sum_i sum_t l_{i,t}``; long sequences weigh more, with no length bias
    in the per-token gradient. Global denominator: the step's number of sequences (rows with at least one
    token; padding rows don't count), summed over micro-batches and ranks.
    """
    return masked_token_sum(loss, loss_mask), _row_has_tokens(loss_mask).sum().to(loss.dtype)


def agg_seq_mean_token_mean(loss: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """seq-mean-token-mean: ``(1/B) sum_i (1/|y_i|) sum_t l_{i,t}``, the original GRPO objective
    (DeepSeekMath eq. 3) and GSPO's. Each sequence weighs the same, so a token of a long answer weighs
    less: Dr.GRPO's length bias (long wrong answers are penalised less per token). A sequence is never
    split across micro-batches, so its inner mean is local; the global denominator is the step's number of
    sequences, as for seq-mean-token-sum.
    """
    m = loss_mask.bool()
    per_seq = torch.where(m, loss, torch.zeros_like(loss)).sum(1) / m.sum(1).clamp(min=1)
    return per_seq.sum(), _row_has_tokens(loss_mask).sum().to(loss.dtype)


def agg_seq_mean_token_sum_norm(
    loss: torch.Tensor, loss_mask: torch.Tensor, max_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr.GRPO's constant normaliser: ``sum_{i,t} l_{i,t} / (B * L)`` with ``L`` a constant (the generation
    budget, e.g. ``max_tokens``), not anything measured on the batch (Liu et al. 2025, arXiv:2503.20783,
    sec. 3.1). No length enters the weights, so the gradient is unbiased in length; the step size of
    the loss then scales with 1/L. Global denominator: ``L *`` the step's number of sequences.
    """
    if max_len <= 0:
        raise ValueError(f"max_len={max_len} must be > 0; pass the generation budget (rollout max_tokens)")
    return masked_token_sum(loss, loss_mask), _row_has_tokens(loss_mask).sum().to(loss.dtype) * max_len


LossAggFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]

LOSS_AGG: dict[str, LossAggFn] = {
    "token-mean": agg_token_mean,
    "seq-mean-token-sum": agg_seq_mean_token_sum,
    "seq-mean-token-mean": agg_seq_mean_token_mean,
    "seq-mean-token-sum-norm": agg_seq_mean_token_sum_norm,
}
"""Aggregation modes: ``fn(loss[B, T], loss_mask[B, T], **kw) -> (numerator, denominator)``; kw:
``seq-mean-token-sum-norm`` needs ``max_len``. Both parts are sums, so a step split into micro-batches
``k`` on ranks ``r`` has loss ``sum_{k,r} num_{k,r} / sum_{k,r} den_{k,r}``: all-reduce the denominators
(they depend only on masks, known before the forward pass), then back-propagate ``num_k / den_global``
per micro-batch (times world size where FSDP averages gradients over ranks)."""


def aggregate_loss(loss: torch.Tensor, loss_mask: torch.Tensor, mode: str = "token-mean", **kw: int) -> torch.Tensor:
    """One batch's scalar loss under ``LOSS_AGG[mode]``: ``numerator / denominator`` (0 if no tokens)."""
    if mode not in LOSS_AGG:
        raise ValueError(f"loss aggregation {mode!r} is not known; use one of {sorted(LOSS_AGG)}")
    num, den = LOSS_AGG[mode](loss, loss_mask, **kw)
    return num / torch.where(den > 0, den, torch.ones_like(den))
