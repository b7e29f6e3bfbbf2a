"""Advantage estimators: rewards in, advantages out. Two families, both pure tensor math.

**Sequence-level** (outcome reward, critic-free): ``fn(rewards[N], group_ids[N], **kw) -> [N]``, one
advantage per completion, broadcast over its tokens by the loss. ``group_ids`` are any labels (equal
label = same prompt); estimators that use no groups still take them so that ``ADVANTAGES`` has one
signature. Extra keywords are estimator-specific, all with defaults. With ``mean_g``/``std_g`` over a
group of size ``G`` and ``mean_B``/``std_B`` over the whole batch:

    GRPO                   A_i = (r_i - mean_g) / (std_g + eps)           Shao et al. 2024, arXiv:2402.03300
    Dr.GRPO                A_i =  r_i - mean_g                            Liu et al. 2025, arXiv:2503.20783
    RLOO                   A_i =  r_i - mean_{j in g, j != i} r_j         Ahmadian et al. 2024, arXiv:2402.14740
                               = G / (G - 1) * (r_i - mean_g)
    REINFORCE++            A_i = (r_i - mean_B) / (std_B + eps)           Hu 2025, arXiv:2501.03262
    REINFORCE++-baseline   c_i =  r_i - mean_g ;  A_i = (c_i - mean_B(c)) / (std_B(c) + eps)   (same paper)

REINFORCE++'s batch statistics are over *tokens* by default, as in the paper and in OpenRLHF and verl:
``mean_B`` and ``std_B`` weight sequence i by its trained-token count n_i (``whiten="token"``), so a long
answer pulls the mean towards its reward. ``whiten="sequence"`` weights every completion once. The
trainer passes ``token_counts`` (loss-mask tokens per sequence) through ``sequence_advantages``.

Dr.GRPO drops GRPO's division by std because it up-weights prompts whose rewards barely vary (too easy or
too hard), a question-level difficulty bias. RLOO's baseline excludes the sample itself, so it is
independent of that sample and the estimator stays unbiased. REINFORCE++ replaces the per-prompt std by
the batch's, which is steadier with small groups; its -baseline variant first removes each prompt's mean
(reward shaping by prompt difficulty) and then rescales by the batch std.

Every ``std`` is the *sample* standard deviation (Bessel-corrected, divisor n-1), what ``torch.std`` and
the reference implementations of GRPO (DeepSeekMath, TRL, verl) compute, so advantage scales stay
comparable across frameworks. A group of one has no baseline and gets advantage 0 from every grouped
estimator; a group (or batch) whose rewards are all equal gets 0 too: nothing to learn from.

**Token-level** (``[B, T]`` in, ``[B, T]`` out; ``mask`` is 1 on completion tokens, 0 on prompt, padding
or, in multi-turn episodes, environment tokens): ``gae_advantages`` for PPO with a critic,
``reinforce_pp_token_advantages`` for REINFORCE++ with per-token rewards (e.g. a per-token KL penalty from
``kl.kl_penalized_rewards``), and the helpers ``last_token_rewards``, ``discounted_returns``,
``masked_whiten``. Masked positions are skipped as if absent: a reward there is ignored, the recursion
bridges them, and their outputs are 0. Right padding is the special case where nothing follows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _check_sequences(rewards: torch.Tensor, group_ids: torch.Tensor) -> None:
    if rewards.ndim != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be "
            "1-D of the same length; pass one reward and one group id per sequence"
        )


def _group_stats(r: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group index [N] (dense 0..K-1), group size [K] and group mean [K] of ``r`` [N]."""
    _, group = torch.unique(group_ids, return_inverse=True)
    num_groups = int(group.max()) + 1 if len(group) else 0
    count = torch.zeros(num_groups, dtype=r.dtype).index_add_(0, group, torch.ones_like(r))
    mean = torch.zeros(num_groups, dtype=r.dtype).index_add_(0, group, r) / count
    return group, count, mean


def _batch_normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over all of ``x`` [N] (sample std); 0 when N < 2."""
    if len(x) < 2:
        return torch.zeros_like(x)
    return (x - x.mean()) / (x.std() + eps)


def _token_normalise(x: torch.Tensor, token_counts: torch.Tensor, eps: float) -> torch.Tensor:
    """``_batch_normalise`` of ``x`` [N] repeated ``token_counts`` [N] times, without building the repeat:

        n = sum_i n_i    mean = sum_i n_i x_i / n    var = sum_i n_i (x_i - mean)^2 / (n - 1)

    the sample statistics of every trained token (``masked_whiten`` of the broadcast advantages).
    Sequences with no trained token get 0; fewer than 2 tokens in all: every advantage is 0."""
    w = token_counts.to(x.dtype)
    if w.shape != x.shape or bool((w < 0).any()):
        raise ValueError(
            f"token_counts {tuple(token_counts.shape)} must be [N]={len(x)} counts >= 0, "
            "one per sequence (its loss-mask tokens)"
        )
    n = w.sum()
    if n < 2:
        return torch.zeros_like(x)
    mean = (w * x).sum() / n
    std = torch.sqrt((w * (x - mean) ** 2).sum() / (n - 1))
    return torch.where(w > 0, (x - mean) / (std + eps), torch.zeros_like(x))


def _whiten(x: torch.Tensor, token_counts: torch.Tensor | None, whiten: str, eps: float) -> torch.Tensor:
    """Batch whitening by convention: ``token`` (needs ``token_counts``) or ``sequence``."""
    if whiten == "sequence":
        return _batch_normalise(x, eps)
    if whiten != "token":
        raise ValueError(f"whiten={whiten!r} is not supported; use token or sequence")
    if token_counts is None:
        raise ValueError(
            "whiten='token' needs token_counts (trained tokens per sequence); pass "
            "loss_mask.sum(1), or whiten='sequence' to weight each completion once"
        )
    return _token_normalise(x, token_counts, eps)


def grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, norm_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages ``(r - mean_g) / (std_g + eps)``; ``norm_std=False`` is Dr.GRPO.

    rewards: [N] float, group_ids: [N] int (any labels; equal label = same group). Returns [N] float32.
    """
    _check_sequences(rewards, group_ids)
    r = rewards.to(torch.float64)  # float64 so that near-equal rewards don't produce noise advantages
    group, count, mean = _group_stats(r, group_ids)
    centred = r - mean[group]
    if norm_std:
        sq = torch.zeros(len(count), dtype=r.dtype).index_add_(0, group, centred**2)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))  # Bessel-corrected sample std
        centred = centred / (std[group] + eps)
    centred = torch.where(count[group] > 1, centred, torch.zeros_like(centred))
    return centred.to(torch.float32)


def dr_grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Dr.GRPO: ``A_i = r_i - mean_g(r)``, GRPO without the std division (arXiv:2503.20783, sec. 3.1).

    Pair it with the ``seq-mean-token-sum-norm`` loss aggregation (constant normaliser), Dr.GRPO's other
    half: together they remove GRPO's length and difficulty biases. [N], [N] -> [N] float32.
    """
    return grpo_advantages(rewards, group_ids, norm_std=False)


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLOO: ``A_i = r_i - (sum_g r - r_i) / (G - 1) = G / (G - 1) * (r_i - mean_g)``.

    The leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024, *Back to Basics*, arXiv:2402.14740)
    does not depend on ``r_i``, so the gradient estimate is unbiased; it equals Dr.GRPO scaled by
    ``G / (G - 1)``. Groups of one get 0. [N], [N] -> [N] float32.
    """
    _check_sequences(rewards, group_ids)
    r = rewards.to(torch.float64)
    group, count, mean = _group_stats(r, group_ids)
    g = count[group]
    adv = g / (g - 1).clamp(min=1) * (r - mean[group])
    return torch.where(g > 1, adv, torch.zeros_like(adv)).to(torch.float32)


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    token_counts: torch.Tensor | None = None,
    whiten: str = "token",
    eps: float = 1e-6,
) -> torch.Tensor:
    """REINFORCE++: ``A_i = (r_i - mean_B) / (std_B + eps)``, whitened over the whole batch, groups unused.

    Hu 2025, *REINFORCE++*, arXiv:2501.03262 (global advantage normalisation), the outcome-reward,
    gamma = 1 case. ``whiten="token"`` (the paper's, OpenRLHF's and verl's convention): the statistics
    are over every trained token, sequence i counted ``token_counts[i]`` times (``_token_normalise``),
    so long answers weigh more. ``whiten="sequence"``: each completion counts once. With per-token
    rewards (a KL penalty) returns differ along a sequence: use ``reinforce_pp_token_advantages``.
    rewards [N], group_ids [N], token_counts [N] -> [N] float32.
    """
    _check_sequences(rewards, group_ids)
    return _whiten(rewards.to(torch.float64), token_counts, whiten, eps).to(torch.float32)


def reinforce_pp_baseline_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    token_counts: torch.Tensor | None = None,
    whiten: str = "token",
    eps: float = 1e-6,
) -> torch.Tensor:
    """REINFORCE++-baseline: ``c_i = r_i - mean_g``, then ``A_i = (c_i - mean_B(c)) / (std_B(c) + eps)``.

    Hu 2025, arXiv:2501.03262 (v2+, the variant for group sampling): the group mean removes per-prompt
    difficulty, the *batch* std (not GRPO's per-group one) sets the scale, so a group with tiny reward
    spread is not blown up. ``mean_B(c)`` is 0 with ``whiten="sequence"`` whenever every group is centred,
    but not over tokens (groups' lengths differ); it is kept for fidelity. Groups of one get ``c = 0``.
    ``whiten`` and ``token_counts`` as in ``reinforce_pp_advantages``. [N], [N], [N] -> [N] float32.
    """
    centred = grpo_advantages(rewards, group_ids, norm_std=False).to(torch.float64)
    return _whiten(centred, token_counts, whiten, eps).to(torch.float32)


AdvantageFn = Callable[..., torch.Tensor]

ADVANTAGES: dict[str, AdvantageFn] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
    "reinforce_pp_baseline": reinforce_pp_baseline_advantages,
}
"""Sequence-level estimators by name: ``fn(rewards[N], group_ids[N], **kw) -> [N]`` (kw: ``grpo`` takes
``norm_std``, ``eps``; ``reinforce_pp*`` take ``token_counts``, ``whiten``, ``eps``). The trainer calls
them through ``sequence_advantages``. Token-level ``gae_advantages`` needs values and
``reinforce_pp_token_advantages`` token rewards, so they are called directly, not through this dict."""

WHITENED: tuple[str, ...] = ("reinforce_pp", "reinforce_pp_baseline")
"""Estimators whose scale is the batch's: they take ``token_counts`` and ``whiten`` (token | sequence)."""

WHITEN_MODES: tuple[str, ...] = ("token", "sequence")
"""``algorithm.whiten`` values: REINFORCE++ statistics over trained tokens (paper) or over completions."""


def sequence_advantages(
    name: str, rewards: torch.Tensor, group_ids: torch.Tensor, token_counts: torch.Tensor, whiten: str = "token"
) -> torch.Tensor:
    """``ADVANTAGES[name]`` for a batch whose sequence i has ``token_counts[i]`` trained tokens [N].

    Only ``WHITENED`` estimators get the counts: GRPO, Dr.GRPO and RLOO compare a completion with its
    group, each completion once, as their papers define them (length enters through the loss
    aggregation, ``aggregation.LOSS_AGG``). rewards, group_ids, token_counts: [N] -> [N] float32.
    """
    if name in WHITENED:
        return ADVANTAGES[name](rewards, group_ids, token_counts=token_counts, whiten=whiten)
    return ADVANTAGES[name](rewards, group_ids)


CRITIC_ESTIMATORS: tuple[str, ...] = ("gae",)
"""Estimators that need a learned value model (PPO): per-token advantages from ``outcome_gae``, computed by
the trainer once the critic has scored the batch. Valid ``algorithm.name`` values besides ``ADVANTAGES``."""


# ---------------------------------------------------------------------------------------- token level
def _check_tokens(mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.shape != mask.shape or t.ndim != 2:
            raise ValueError(
                f"{name} {tuple(t.shape)} must be [B, T] like mask {tuple(mask.shape)}; "
                "align it with the loss mask (one entry per completion-token position)"
            )


def last_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Outcome reward placed on each row's last masked position: [B], [B, T] -> [B, T] float32.

    Rows with no masked position get nothing (their reward is dropped; they carry no loss either).
    """
    if rewards.shape != mask.shape[:1]:
        raise ValueError(f"rewards {tuple(rewards.shape)} must be [B]={mask.shape[0]}, one per row of mask")
    m = mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(m)
    last = torch.where(m, positions, -1).max(dim=1).values  # [B], -1 if the row is empty
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    has = last >= 0
    out[has.nonzero().squeeze(1), last[has]] = rewards[has].to(torch.float32)
    return out


@torch.no_grad()
def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation for PPO (Schulman et al. 2016, arXiv:1506.02438, eq. 16).

        delta_t = r_t + gamma * V_{t+1} - V_t          (V after the last token = 0: the episode ends)
        A_t     = delta_t + gamma * lam * A_{t+1}  =  sum_k (gamma lam)^k delta_{t+k}
        R_t     = A_t + V_t                            (lambda-return: the critic's regression target)

    ``t+1`` means the next *masked* position: masked-out positions are skipped (right padding, or tool
    output inside a multi-turn episode), as in verl's GAE. ``lam = 1`` gives the Monte-Carlo return minus
    V (unbiased, high variance); ``lam = 0`` the one-step TD error. LLM PPO usually runs gamma = lam = 1
    with the reward on the last token (``last_token_rewards``) plus a per-token KL penalty. PPO then
    usually whitens the advantages (``masked_whiten``), never the returns.

    rewards, values, mask: [B, T] (values detached). Returns (advantages, returns), both [B, T] float32,
    zero off the mask. The loop runs over T with [B]-wide steps, computed in float64.
    """
    _check_tokens(mask, rewards=rewards, values=values)
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma={gamma} and lam={lam} must lie in [0, 1]; PPO for LLMs uses gamma=1, lam=0.95..1")
    r, v, m = rewards.to(torch.float64), values.to(torch.float64), mask.bool()
    adv = torch.zeros_like(r)
    next_value, next_adv = r.new_zeros(r.shape[0]), r.new_zeros(r.shape[0])  # [B] at the next masked position
    for t in reversed(range(r.shape[1])):
        a = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * next_adv
        on = m[:, t]
        adv[:, t] = torch.where(on, a, 0.0)
        next_value = torch.where(on, v[:, t], next_value)
        next_adv = torch.where(on, a, next_adv)
    returns = torch.where(m, adv + v, 0.0)
    return adv.to(torch.float32), returns.to(torch.float32)


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Reward-to-go ``G_t = sum_k gamma^k r_{t+k}`` over masked positions: [B, T] -> [B, T] float32.

    It is GAE with ``V = 0`` and ``lam = 1``, so it shares GAE's masking rules.
    """
    return gae_advantages(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)[0]


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the masked entries of ``values`` [B, T] (sample std); 0 off the mask.

    Token-weighted: a sequence counts once per token. Under data parallelism the mean and std must be over
    the whole step, so call it on the full step batch (the trainer builds it identically on every rank)
    before splitting, not per rank or micro-batch.
    """
    _check_tokens(mask, values=values)
    m = mask.bool()
    x = values.to(torch.float64)[m]
    if x.numel() < 2:
        return torch.zeros_like(values, dtype=torch.float32)
    whitened = (values.to(torch.float64) - x.mean()) / (x.std() + eps)
    return torch.where(m, whitened, 0.0).to(torch.float32)


def reinforce_pp_token_advantages(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++ with per-token rewards: ``A_t = whiten_B(G_t)``, ``G_t`` the discounted return-to-go.

    Hu 2025, arXiv:2501.03262: token-level return with a KL penalty in the reward, globally whitened;
    pass ``rewards = last_token_rewards(r, mask) - kl_coef * kl`` (``kl.kl_penalized_rewards``).
    [B, T] -> [B, T] float32.
    """
    return masked_whiten(discounted_returns(rewards, mask, gamma), mask)


@torch.no_grad()
def outcome_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    kl_penalty: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's advantages for an outcome reward: the reward on the last token, a per-token KL penalty on
    every token, then GAE against the critic's values (Ouyang et al. 2022, arXiv:2203.02155, eq. 2)::

        r_t = [t = last] * R  -  kl_penalty_t          kl_penalty = kl_coef * k(pi_old, pi_ref), or None
        (A, R_t) = gae_advantages(r, V, mask, gamma, lam)

    rewards: [B] one scalar per sequence; values, mask, kl_penalty: [B, T] aligned with the loss mask
    (``kl.kl_penalized_rewards`` is the same penalty applied to ``r``). Returns (advantages, returns)
    [B, T] float32, zero off the mask; whiten the advantages over the whole step (``whiten_from_moments``).
    """
    token_rewards = last_token_rewards(rewards, mask)
    if kl_penalty is not None:
        _check_tokens(mask, kl_penalty=kl_penalty)
        token_rewards = torch.where(mask.bool(), token_rewards - kl_penalty.to(torch.float32), 0.0)
    return gae_advantages(token_rewards, values, mask, gamma, lam)


def masked_moments(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[n, sum x, sum x^2]`` over the masked entries of ``x`` [B, T], float64: sums, so the moments of a
    step split over micro-batches and ranks are the sum of the parts' (one all-reduce)."""
    _check_tokens(mask, x=x)
    m = mask.bool()
    v = x.to(torch.float64)[m]
    return torch.stack([v.new_tensor(float(v.numel())), v.sum(), (v * v).sum()])


def moments_mean_var(moments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, sample variance) from ``masked_moments`` ``[n, s1, s2]``: ``var = (s2 - s1^2 / n) / (n - 1)``;
    (0, 0) when n < 2."""
    n, s1, s2 = moments.to(torch.float64)
    if n < 2:
        return s1.new_zeros(()), s1.new_zeros(())
    mean = s1 / n
    return mean, ((s2 - s1 * mean) / (n - 1)).clamp(min=0.0)


def whiten_from_moments(x: torch.Tensor, mask: torch.Tensor, moments: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``masked_whiten`` with the mean and std of a larger set (the whole step) given as its moments: each
    micro-batch is whitened with the step's statistics. [B, T] -> [B, T] float32, 0 off the mask."""
    mean, var = moments_mean_var(moments)
    if moments[0] < 2:
        return torch.zeros_like(x, dtype=torch.float32)
    whitened = (x.to(torch.float64) - mean) / (var.sqrt() + eps)
    return torch.where(mask.bool(), whitened, 0.0).to(torch.float32)
