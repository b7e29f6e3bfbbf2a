"""The algorithm's objective, resolved from ``AlgorithmConfig`` once: ``build_loss(algo)`` is the one place
where config fields become callables with their keywords bound.

    policy_loss     POLICY_LOSSES[policy_loss] with its clip (clip_eps, clip_eps_high, dual_clip_c)
    off_policy      how tokens are weighed by w = pi_old / mu (tis, tis_sequence, decoupled) or not at all
    aggregate       LOSS_AGG[loss_agg] (seq-mean-token-sum-norm: with max_len = norm_len)
    kl, entropy     kl_coef * KL_ESTIMATORS[kl_estimator], entropy_coef
    select_groups   groups with nothing to learn left out; DAPO's dynamic sampling and overlong reward shaping

The micro-batch step (``trainer/step.py``) only calls these; no other trainer file reads the algorithm's loss
fields. Unlike its neighbours this file reads a config object (``AlgorithmConfig``): it is the one place
that turns those fields into the plain callables the others are.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from relayrl.algorithms.aggregation import LOSS_AGG
from relayrl.algorithms.filtering import dynamic_sampling_filter, trainable_groups
from relayrl.algorithms.losses import POLICY_LOSSES
from relayrl.algorithms.shaping import overlong_penalty
from relayrl.config import AlgorithmConfig
from relayrl.config.algorithm import ZERO_SPREAD_ESTIMATORS
from relayrl.types import TrajectoryGroup

if TYPE_CHECKING:  # the trainer's record, named in one annotation; algorithms/ never imports trainer/
    from relayrl.trainer.batch import MicroBatch


@dataclass(frozen=True)
class Objective:
    """What a train step optimises, with every hyper-parameter bound (made by ``build_loss``)."""

    policy_loss: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
    """(logprobs, old_logprobs, advantages, loss_mask, **off_policy) -> (per-token loss [b, T], stats)."""
    off_policy: dict[str, float | str] | None
    """Keywords of the importance weight ``w = pi_old / mu`` (``is_level``, ``is_cap``); None: no weight."""
    aggregate: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    """(per_token [b, T], loss_mask [b, T]) -> (numerator, denominator) of the ``LOSS_AGG`` mode."""
    kl_coef: float
    """Weight of the KL to the reference (0: no reference model)."""
    kl_estimator: str
    """``KL_ESTIMATORS`` key of that KL."""
    entropy_coef: float
    """Weight of the entropy bonus (0: entropy is only reported)."""
    dynamic_sampling: bool
    """DAPO: drop groups whose rewards don't vary."""
    drop_zero_spread: bool
    """``algorithm.drop_zero_spread`` under an estimator that gives a group whose rewards don't vary advantage 0;
    such groups are left out where that is their whole loss (``only_advantages``)."""
    reward_shaping: Callable[[torch.Tensor], torch.Tensor] | None
    """DAPO's overlong penalty: completion lengths [N] -> reward terms [N]; None: off."""

    def policy(
        self, logprobs: torch.Tensor, old: torch.Tensor, mb: MicroBatch
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Per-token policy loss [b, T] and its stats, tokens weighed by ``pi_old / mu`` if off_policy is set."""
        behaviour = {} if self.off_policy is None else {"behaviour_logprobs": mb.behaviour_logprobs, **self.off_policy}
        return self.policy_loss(logprobs, old, mb.advantages, mb.loss_mask, **behaviour)

    @property
    def only_advantages(self) -> bool:
        """True when the advantage is the loss's only weight: a token with advantage 0 adds nothing to the
        loss or its gradient (no KL or entropy term), so a micro-batch of such tokens can be skipped."""
        return self.kl_coef == 0 and self.entropy_coef == 0

    def select_groups(self, groups: list[TrajectoryGroup]) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        """The groups the step trains on, and the statistics of leaving the others out.

        DAPO's dynamic sampling, or else ``drop_zero_spread``, drops groups whose rewards don't vary; both read
        the rewards from the reward functions, before the overlong term (DAPO filters on accuracy), after
        exclusions (``trainable_groups``). The overlong penalty itself is added in ``build_train_batch``.
        Stats: ``skipped_groups`` (zero-spread groups left out, 0 when off), ``dapo/dropped_groups``,
        ``dapo/kept_groups``, ``dapo/overlong_penalty`` (mean term added to the reward), ``dapo/overlong_frac``
        (share penalised).
        """
        stats: dict[str, float] = {"skipped_groups": 0.0}
        if self.dynamic_sampling:
            groups, dropped = dynamic_sampling_filter(trainable_groups(groups))
            stats |= {"dapo/dropped_groups": float(dropped), "dapo/kept_groups": float(len(groups))}
        elif self.drop_zero_spread and self.only_advantages:
            groups, dropped = dynamic_sampling_filter(trainable_groups(groups))
            stats["skipped_groups"] = float(dropped)
        if self.reward_shaping is not None and groups:
            lengths = [len(t.completion_token_ids) for g in groups for t in g.trajectories if t.excluded is None]
            penalty = self.reward_shaping(torch.tensor(lengths))
            stats |= {
                "dapo/overlong_penalty": float(penalty.mean()),
                "dapo/overlong_frac": float((penalty < 0).float().mean()),
            }
        return groups, stats


def build_loss(algo: AlgorithmConfig) -> Objective:
    """The ``Objective`` of ``algo``; raises on a field ``load_config`` would have filled in."""
    return Objective(
        policy_loss=functools.partial(POLICY_LOSSES[algo.policy_loss], **policy_loss_kwargs(algo)),
        off_policy=off_policy_kwargs(algo),
        aggregate=functools.partial(LOSS_AGG[algo.loss_agg], **loss_agg_kwargs(algo)),
        kl_coef=algo.kl_coef,
        kl_estimator=algo.kl_estimator,
        entropy_coef=algo.entropy_coef,
        dynamic_sampling=algo.dynamic_sampling,
        drop_zero_spread=algo.drop_zero_spread and algo.name in ZERO_SPREAD_ESTIMATORS,
        reward_shaping=reward_shaping(algo),
    )


def policy_loss_kwargs(algo: AlgorithmConfig) -> dict[str, float]:
    """The hyper-parameters ``POLICY_LOSSES[algo.policy_loss]`` takes; clip_eps_high None = symmetric."""
    if algo.policy_loss == "ppo_clip":
        return {"clip_eps": algo.clip_eps}
    high = algo.clip_eps if algo.clip_eps_high is None else algo.clip_eps_high
    kw = {"clip_eps": algo.clip_eps, "clip_eps_high": high}
    if algo.policy_loss == "dual_clip":
        kw["dual_clip_c"] = algo.dual_clip_c
    return kw


def off_policy_kwargs(algo: AlgorithmConfig) -> dict[str, float | str] | None:
    """How the policy loss weighs tokens by ``w = pi_old / mu`` (None: not at all). ``auto`` is resolved by
    ``load_config``; left unresolved it means none. ``decoupled``: AReaL's objective, w untruncated."""
    by_name: dict[str, dict[str, float | str]] = {
        "tis": {"is_level": "token", "is_cap": algo.is_cap},
        "tis_sequence": {"is_level": "sequence", "is_cap": algo.is_cap},
        "decoupled": {"is_level": "token", "is_cap": math.inf},
    }
    return by_name.get(algo.off_policy)


def loss_agg_kwargs(algo: AlgorithmConfig) -> dict[str, int]:
    """The keywords ``LOSS_AGG[algo.loss_agg]`` takes: only seq-mean-token-sum-norm needs ``max_len``."""
    if algo.loss_agg != "seq-mean-token-sum-norm":
        return {}
    if algo.norm_len is None:
        raise ValueError(
            "algorithm.loss_agg=seq-mean-token-sum-norm needs algorithm.norm_len; set it to "
            "rollout.max_tokens (load_config does this by default)"
        )
    return {"max_len": algo.norm_len}


def reward_shaping(algo: AlgorithmConfig) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """DAPO's overlong penalty with its lengths bound (None when ``algorithm.overlong_buffer`` is 0)."""
    if not algo.overlong_buffer:
        return None
    if algo.overlong_max_len is None:
        raise ValueError(
            "algorithm.overlong_buffer is set but algorithm.overlong_max_len is None; set it "
            "to rollout.max_tokens (load_config does this by default)"
        )
    return functools.partial(
        overlong_penalty, max_len=algo.overlong_max_len, buffer_len=algo.overlong_buffer, factor=algo.overlong_penalty
    )
