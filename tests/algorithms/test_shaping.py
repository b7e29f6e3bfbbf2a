"""DAPO's batch shaping on hand examples: the overlong penalty and the dynamic-sampling filter (how the
trainer wires them into a batch is tested in ``tests/trainer/test_batch.py``)."""

import pytest
import torch

from relayrl.algorithms.filtering import dynamic_sampling_filter, has_reward_spread
from relayrl.algorithms.shaping import overlong_penalty
from relayrl.types import Exclusion, Trajectory, TrajectoryGroup, VersionSpan


def _traj(prompt_id, idx, completion, reward, excluded=None):
    return Trajectory(
        prompt_id=prompt_id,
        sample_idx=idx,
        prompt_token_ids=[1, 2],
        completion_token_ids=completion,
        behaviour_logprobs=[-0.5] * len(completion),
        completion_text="",
        finish_reason="stop",
        versions=[VersionSpan(0, 0, len(completion))],
        reward=reward,
        excluded=excluded,
    )


def _group(prompt_id, rewards, lengths=None, excluded=()):
    lengths = lengths or [1] * len(rewards)
    return TrajectoryGroup(
        prompt_id,
        f"p{prompt_id}",
        {},
        [
            _traj(prompt_id, i, [5] * n, r, Exclusion("f", "raised") if i in excluded else None)
            for i, (r, n) in enumerate(zip(rewards, lengths))
        ],
    )


def test_overlong_penalty_hand_numbers():
    # L_max 16, L_cache 4 -> soft limit 12: 0 up to 12 tokens, then -(|y| - 12) / 4, -1 beyond 16
    lengths = torch.tensor([0, 12, 13, 14, 15, 16, 17])
    torch.testing.assert_close(
        overlong_penalty(lengths, max_len=16, buffer_len=4), torch.tensor([0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0])
    )
    torch.testing.assert_close(
        overlong_penalty(lengths, 16, 4, factor=0.5), torch.tensor([0.0, 0.0, -0.125, -0.25, -0.375, -0.5, -0.5])
    )
    assert overlong_penalty(lengths, 16, 0).abs().sum() == 0  # buffer 0: off
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
