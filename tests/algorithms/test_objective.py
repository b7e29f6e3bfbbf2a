"""``build_loss``: the one translation of ``AlgorithmConfig`` into bound callables, and DAPO's selection."""

from __future__ import annotations

import functools
import math
import re

import pytest
import torch

from relayrl.algorithms.aggregation import LOSS_AGG
from relayrl.algorithms.losses import POLICY_LOSSES
from relayrl.algorithms.objective import build_loss
from relayrl.config import AlgorithmConfig
from relayrl.types import Trajectory, TrajectoryGroup, VersionSpan


@pytest.mark.parametrize(
    "algo,keywords",
    [
        (AlgorithmConfig(policy_loss="ppo_clip", clip_eps=0.1), {"clip_eps": 0.1}),
        (AlgorithmConfig(policy_loss="clip_higher", clip_eps_high=0.28), {"clip_eps": 0.2, "clip_eps_high": 0.28}),
        (
            AlgorithmConfig(policy_loss="dual_clip", dual_clip_c=3.0),
            {"clip_eps": 0.2, "clip_eps_high": 0.2, "dual_clip_c": 3.0},
        ),
    ],
)
def test_policy_loss_gets_its_clip(algo, keywords):
    loss = build_loss(algo).policy_loss
    assert isinstance(loss, functools.partial)
    assert loss.func is POLICY_LOSSES[algo.policy_loss] and loss.keywords == keywords


@pytest.mark.parametrize(
    "off_policy,expected",
    [
        ("tis", {"is_level": "token", "is_cap": 2.0}),
        ("tis_sequence", {"is_level": "sequence", "is_cap": 2.0}),
        ("decoupled", {"is_level": "token", "is_cap": math.inf}),
        ("none", None),
        ("auto", None),
    ],
)
def test_off_policy_keywords(off_policy, expected):
    assert build_loss(AlgorithmConfig(off_policy=off_policy, is_cap=2.0)).off_policy == expected


def test_loss_agg_binds_norm_len_and_needs_it():
    # seq-mean-token-sum-norm of one row [1, 2] (mask [1, 1]) with L = 4: (3, 1 * 4)
    agg = build_loss(AlgorithmConfig(loss_agg="seq-mean-token-sum-norm", norm_len=4)).aggregate
    assert isinstance(agg, functools.partial)
    assert agg.func is LOSS_AGG["seq-mean-token-sum-norm"]
    assert [float(x) for x in agg(torch.tensor([[1.0, 2.0]]), torch.ones(1, 2))] == [3.0, 4.0]
    with pytest.raises(ValueError, match=re.escape("needs algorithm.norm_len; set it to rollout.max_tokens")):
        build_loss(AlgorithmConfig(loss_agg="seq-mean-token-sum-norm"))


def _group(index: int, rewards: list[float], lengths: list[int]) -> TrajectoryGroup:
    return TrajectoryGroup(
        index,
        "p",
        {},
        [
            Trajectory(index, s, [1, 2], [3] * n, [-1.0] * n, "", "stop", [VersionSpan(0, 0, n)], reward=r)
            for s, (r, n) in enumerate(zip(rewards, lengths))
        ],
    )


def test_select_groups_drops_flat_groups_and_reports_the_overlong_penalty():
    # max_len 8, buffer 4: length 4 -> 0, 6 -> (4 - 6) / 4 = -.5, 10 -> -1 (factor 1); flat group dropped
    algo = AlgorithmConfig(dynamic_sampling=True, overlong_buffer=4, overlong_max_len=8)
    groups, stats = build_loss(algo).select_groups(
        [_group(0, [1.0, 0.0], [4, 6]), _group(1, [0.5, 0.5], [2, 2]), _group(2, [0.0, 1.0], [10, 4])]
    )
    assert [g.prompt_id for g in groups] == [0, 2]
    assert stats == {
        "skipped_groups": 0.0,  # dynamic sampling's drop is counted as DAPO's
        "dapo/dropped_groups": 1.0,
        "dapo/kept_groups": 2.0,
        "dapo/overlong_penalty": pytest.approx(-1.5 / 4),
        "dapo/overlong_frac": 0.5,
    }


def test_overlong_buffer_needs_its_max_len():
    with pytest.raises(ValueError, match=re.escape("overlong_max_len is None; set it to rollout.max_tokens")):
        build_loss(AlgorithmConfig(overlong_buffer=4))


FLAT_STEP = [_group(0, [1.0, 0.0], [2, 2]), _group(1, [0.5, 0.5], [2, 2]), _group(2, [0.0, 0.0], [3, 3])]


def test_zero_spread_groups_are_left_out_by_default():
    groups, stats = build_loss(AlgorithmConfig()).select_groups(FLAT_STEP)
    assert [g.prompt_id for g in groups] == [0]
    assert stats == {"skipped_groups": 2.0}


@pytest.mark.parametrize(
    "algo",
    [
        AlgorithmConfig(drop_zero_spread=False),
        AlgorithmConfig(kl_coef=0.01),  # the KL term still reaches a flat group's tokens
        AlgorithmConfig(entropy_coef=0.01),
        AlgorithmConfig(name="reinforce_pp_baseline"),  # whitened over the batch: a flat group's A is not 0
        AlgorithmConfig(name="reinforce_pp", group_size=1),
        AlgorithmConfig(name="gae"),
    ],
    ids=["off", "kl", "entropy", "reinforce_pp_baseline", "reinforce_pp", "gae"],
)
def test_zero_spread_groups_stay_where_they_still_carry_a_loss(algo):
    groups, stats = build_loss(algo).select_groups(FLAT_STEP)
    assert [g.prompt_id for g in groups] == [0, 1, 2] and stats["skipped_groups"] == 0.0


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_dropped_groups_are_exactly_those_the_estimator_gives_zero_advantage(name):
    from relayrl.algorithms.advantages import ADVANTAGES

    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.0, 0.0])
    advantages = ADVANTAGES[name](rewards, torch.tensor([0, 0, 1, 1, 2, 2]))
    kept, _ = build_loss(AlgorithmConfig(name=name)).select_groups(FLAT_STEP)
    zero = [bool((advantages[2 * i : 2 * i + 2] == 0).all()) for i in range(3)]
    assert zero == [g.prompt_id not in {k.prompt_id for k in kept} for g in FLAT_STEP] == [False, True, True]
