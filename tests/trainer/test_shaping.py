"""DAPO's batch shaping on hand examples: the overlong penalty, the dynamic-sampling filter, and both wired
into ``build_train_batch`` (rewards shaped before advantages)."""

import pytest
import torch

from relayrl.trainer.batch import build_train_batch
from relayrl.trainer.groups import dynamic_sampling_filter, has_reward_spread
from relayrl.trainer.shaping import overlong_penalty
from relayrl.types import Exclusion, Trajectory, TrajectoryGroup, VersionSpan


def _traj(prompt_id, idx, completion, reward, excluded=None):
    return Trajectory(prompt_id=prompt_id, sample_idx=idx, prompt_token_ids=[1, 2], completion_token_ids=completion,
                      behaviour_logprobs=[-0.5] * len(completion), completion_text="", finish_reason="stop",
                      versions=[VersionSpan(0, 0, len(completion))], reward=reward, excluded=excluded)


def _group(prompt_id, rewards, lengths=None, excluded=()):
    lengths = lengths or [1] * len(rewards)
    return TrajectoryGroup(prompt_id, f"p{prompt_id}", {}, [
        _traj(prompt_id, i, [5] * n, r, Exclusion("f", "raised") if i in excluded else None)
        for i, (r, n) in enumerate(zip(rewards, lengths))])


def test_overlong_penalty_hand_numbers():
    # L_max 16, L_cache 4 -> soft limit 12: 0 up to 12 tokens, then -(|y| - 12) / 4, -1 beyond 16
    lengths = torch.tensor([0, 12, 13, 14, 15, 16, 17])
    torch.testing.assert_close(overlong_penalty(lengths, max_len=16, buffer_len=4),
                               torch.tensor([0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]))
    torch.testing.assert_close(overlong_penalty(lengths, 16, 4, factor=0.5),
                               torch.tensor([0.0, 0.0, -0.125, -0.25, -0.375, -0.5, -0.5]))
    assert overlong_penalty(lengths, 16, 0).abs().sum() == 0                  # buffer 0: off
    # buffer = max_len: the ramp starts at 0 tokens
    torch.testing.assert_close(overlong_penalty(torch.tensor([0, 2, 4]), 4, 4), torch.tensor([0.0, -0.5, -1.0]))
    with pytest.raises(ValueError, match="overlong_buffer"):
        overlong_penalty(lengths, max_len=4, buffer_len=8)


def test_dynamic_sampling_drops_groups_without_reward_spread():
    varied = _group(0, [1.0, 0.0, 1.0])
    all_right = _group(1, [1.0, 1.0, 1.0])
    all_wrong = _group(2, [0.0, 0.0])
    # differing only in a trajectory whose reward failed: the scored ones agree -> no spread
    spread_only_via_excluded = _group(3, [0.5, 0.5, 0.9], excluded=(2,))
    continuous = _group(4, [0.25, 0.2500001])
    kept, dropped = dynamic_sampling_filter([varied, all_right, all_wrong, spread_only_via_excluded, continuous])
    assert [g.prompt_id for g in kept] == [0, 4] and dropped == 3
    assert not has_reward_spread(all_right) and has_reward_spread(varied)
    assert dynamic_sampling_filter([]) == ([], 0)


def test_overlong_shaping_enters_rewards_before_advantages():
    # completions of 1, 3 | 4, 2 tokens; L_max 4, L_cache 2 (soft limit 2): penalties 0, -.5 | -1, 0
    # rewards 1, 1 | 1, 0 -> shaped 1, .5 | 0, 0
    # dr_grpo: group a mean .75 -> .25, -.25 ; group b: equal -> 0, 0
    groups = [_group(0, [1.0, 1.0], [1, 3]), _group(1, [1.0, 0.0], [4, 2])]
    shaping = lambda n: overlong_penalty(n, max_len=4, buffer_len=2)  # noqa: E731
    batch = build_train_batch(groups, pad_token_id=0, estimator="dr_grpo", reward_shaping=shaping)
    torch.testing.assert_close(batch.rewards, torch.tensor([1.0, 0.5, 0.0, 0.0]))
    torch.testing.assert_close(batch.advantages, torch.tensor([0.25, -0.25, 0.0, 0.0]))
    plain = build_train_batch(groups, pad_token_id=0, estimator="dr_grpo")
    torch.testing.assert_close(plain.rewards, torch.tensor([1.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(plain.advantages, torch.tensor([0.0, 0.0, 0.5, -0.5]))


def test_critic_estimator_leaves_advantages_to_the_trainer():
    batch = build_train_batch([_group(0, [1.0, 0.5], [2, 3])], pad_token_id=0, estimator="gae")
    assert batch.advantages.tolist() == [0.0, 0.0]
    torch.testing.assert_close(batch.rewards, torch.tensor([1.0, 0.5]))
    with pytest.raises(ValueError, match="gae"):
        build_train_batch([_group(0, [1.0, 0.5])], pad_token_id=0, estimator="ppo")
