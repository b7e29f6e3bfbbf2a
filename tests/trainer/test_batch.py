"""Batch building on a hand example: padding, next-token alignment of masks/logprobs, advantages, splits,
and DAPO's overlong penalty entering rewards before advantages."""

import pytest
import torch

from relayrl.algorithms.filtering import trainable_groups
from relayrl.algorithms.shaping import overlong_penalty
from relayrl.trainer.batch import build_train_batch, split_batch
from relayrl.types import Exclusion, Trajectory, TrajectoryGroup, VersionSpan


def _traj(prompt_id, idx, prompt, completion, logprobs, reward):
    return Trajectory(
        prompt_id=prompt_id,
        sample_idx=idx,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        behaviour_logprobs=logprobs,
        completion_text="",
        finish_reason="stop",
        versions=[VersionSpan(0, 0, len(completion))],
        reward=reward,
    )


def _groups():
    a = TrajectoryGroup(
        10, "a", {}, [_traj(10, 0, [5, 6, 7], [8, 9], [-0.1, -0.2], 1.0), _traj(10, 1, [5, 6, 7], [10], [-0.3], 0.0)]
    )
    b = TrajectoryGroup(
        11, "b", {}, [_traj(11, 0, [1], [2, 3, 4], [-0.4, -0.5, -0.6], 1.0), _traj(11, 1, [1], [11], [-0.7], 1.0)]
    )
    return [a, b]


def test_hand_example():
    batch = build_train_batch(_groups(), pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 10, 0], [1, 2, 3, 4, 0], [1, 11, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    # completion token k of a prompt of length P is predicted at position P-1+k
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 0], [1, 0, 0, 0]]
    torch.testing.assert_close(
        batch.behaviour_logprobs,
        torch.tensor([[0, 0, -0.1, -0.2], [0, 0, -0.3, 0], [-0.4, -0.5, -0.6, 0], [-0.7, 0, 0, 0]]),
    )
    # group a: rewards 1, 0 -> mean .5, sample std .70711 -> +-.70711 ; group b: equal rewards -> 0
    torch.testing.assert_close(batch.advantages, torch.tensor([0.707106, -0.707106, 0.0, 0.0]), atol=1e-5, rtol=0)
    assert batch.prompt_ids == [10, 10, 11, 11]


def test_masked_positions_point_at_completion_tokens():
    groups = _groups()
    batch = build_train_batch(groups, pad_token_id=0)
    trajs = [t for g in groups for t in g.trajectories]
    for b, t in enumerate(trajs):
        positions = batch.loss_mask[b].nonzero().squeeze(1)
        assert batch.input_ids[b, positions + 1].tolist() == t.completion_token_ids


def test_dr_grpo_and_same_prompt_in_two_groups():
    a, b = _groups()
    b.prompt_id = 10  # two groups of one prompt are still normalised separately
    batch = build_train_batch([a, b], pad_token_id=0, estimator="dr_grpo")
    torch.testing.assert_close(batch.advantages, torch.tensor([0.5, -0.5, 0.0, 0.0]))


@pytest.mark.parametrize(
    "estimator, whiten, expected",
    [
        ("rloo", "token", [1.0, -1.0, 0.0, 0.0]),  # G/(G-1) * (r - mean_g) = 2 * +-0.5
        # batch-whitened: rewards 1, 0, 1, 1 -> mean .75, sample std .5 -> (r - .75) / .5
        ("reinforce_pp", "sequence", [0.5, -1.5, 0.5, 0.5]),
        # over tokens (2, 1, 3, 1 of them): six 1s, one 0 -> mean 6/7, var (6/49 + 36/49)/6 = 1/7, std .377964
        ("reinforce_pp", "token", [0.377964, -2.267787, 0.377964, 0.377964]),
        # centred by group: .5, -.5, 0, 0 -> mean 0, sample std sqrt(.5/3) = .40825 -> +-1.22474
        ("reinforce_pp_baseline", "sequence", [1.224745, -1.224745, 0.0, 0.0]),
        # over tokens: .5 .5 -.5 0 0 0 0 -> mean 1/14, var (5/7)/6, std .345033
        ("reinforce_pp_baseline", "token", [1.242118, -1.656157, -0.207020, -0.207020]),
    ],
)
def test_estimator_is_picked_by_name(estimator, whiten, expected):
    batch = build_train_batch(_groups(), pad_token_id=0, estimator=estimator, whiten=whiten)
    torch.testing.assert_close(batch.advantages, torch.tensor(expected), atol=1e-5, rtol=0)


def test_bad_input():
    with pytest.raises(ValueError, match="behaviour logprobs"):
        build_train_batch([TrajectoryGroup(0, "", {}, [_traj(0, 0, [1], [2, 3], [-1.0], 0.0)])], 0)
    with pytest.raises(ValueError, match="no trajectories"):
        build_train_batch([], 0)
    with pytest.raises(ValueError, match="estimator 'ppo' is not known; use one of grpo, dr_grpo"):
        build_train_batch(_groups(), 0, "ppo")


def test_split_even_covers_batch_in_order():
    batch = build_train_batch(_groups(), pad_token_id=0)
    shares = [split_batch(batch, r, 2) for r in range(2)]
    assert [len(s) for s in shares] == [2, 2]
    assert torch.equal(torch.cat([s.input_ids for s in shares]), batch.input_ids)
    assert torch.equal(torch.cat([s.loss_mask for s in shares]), batch.loss_mask)
    assert torch.equal(torch.cat([s.advantages for s in shares]), batch.advantages)


def test_split_uneven_pads_with_zero_weight_copies():
    batch = build_train_batch(_groups(), pad_token_id=0)
    shares = [split_batch(batch, r, 3) for r in range(3)]  # ceil(4/3) = 2 rows each, 6 slots for 4 rows
    assert [len(s) for s in shares] == [2, 2, 2]
    last = shares[2]
    assert torch.equal(last.input_ids, batch.input_ids[[0, 0]])  # real tokens: attention stays defined
    assert last.loss_mask.sum() == 0 and torch.equal(last.advantages, torch.zeros(2))
    assert last.prompt_ids == [-1, -1]
    assert sum(s.loss_mask.sum() for s in shares) == batch.loss_mask.sum()
    assert batch.loss_mask[0].sum() == 2  # original untouched by the padding
    with pytest.raises(ValueError, match="rank"):
        split_batch(batch, 3, 3)


def test_excluded_trajectories_are_not_trained_on():
    """Group a keeps 2 of 3 (stats over those two), group b keeps 1 of 2 (dropped), group c lost none."""
    a = TrajectoryGroup(
        10,
        "a",
        {},
        [
            _traj(10, 0, [5], [6], [-0.1], 1.0),
            _traj(10, 1, [5], [7], [-0.2], 0.0),
            _traj(10, 2, [5], [8, 9], [-0.3, -0.4], 0.0),
        ],
    )
    b = TrajectoryGroup(11, "b", {}, [_traj(11, 0, [1], [2], [-0.5], 1.0), _traj(11, 1, [1], [3], [-0.6], 0.0)])
    c = TrajectoryGroup(12, "c", {}, [_traj(12, 0, [4], [2], [-0.7], 3.0)])  # G=1 (e.g. REINFORCE++)
    a.trajectories[1].excluded = Exclusion("f", "timeout")
    b.trajectories[0].excluded = Exclusion("f", "raised", "KeyError")
    assert [[t.sample_idx for t in g.trajectories] for g in trainable_groups([a, b, c])] == [[0, 2], [0]]
    batch = build_train_batch([a, b, c], pad_token_id=0, estimator="dr_grpo")
    assert batch.prompt_ids == [10, 10, 12]
    assert batch.input_ids.tolist() == [[5, 6, 0], [5, 8, 9], [4, 2, 0]]
    # group a over samples 0 and 2 only: rewards 1, 0 -> mean .5 (with sample 1 it would be 1/3)
    torch.testing.assert_close(batch.advantages, torch.tensor([0.5, -0.5, 0.0]))
    assert len(a.trajectories) == 3  # the input groups are not modified
    for t in a.trajectories + c.trajectories:
        t.excluded = Exclusion("f", "non_finite")
    with pytest.raises(ValueError, match=r"no trajectories to train on \(4 given; excluded ones"):
        build_train_batch([a, c], pad_token_id=0)


def test_completion_mask_keeps_environment_tokens_out_of_the_loss():
    """Multi-turn: prompt [5, 6]; model [8, 9], env [30, 31], model [10] -> mask 1 1 0 0 1 on the completion.

    Completion token k of a P=2 prompt is scored at position 1+k: mask columns 1..5 = 1, 1, 0, 0, 1.
    The single-turn sample (mask None) keeps all its completion positions.
    """
    multi = _traj(10, 0, [5, 6], [8, 9, 30, 31, 10], [-0.1, -0.2, 0.0, 0.0, -0.3], 1.0)
    multi.completion_mask = [1, 1, 0, 0, 1]
    single = _traj(10, 1, [5, 6], [7, 8], [-0.4, -0.5], 0.0)
    batch = build_train_batch([TrajectoryGroup(10, "p", {}, [multi, single])], pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 8, 9, 30, 31, 10], [5, 6, 7, 8, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 1, 1, 0, 0, 1], [0, 1, 1, 0, 0, 0]]
    torch.testing.assert_close(
        batch.behaviour_logprobs, torch.tensor([[0, -0.1, -0.2, 0, 0, -0.3], [0, -0.4, -0.5, 0, 0, 0]])
    )
    positions = batch.loss_mask[0].nonzero().squeeze(1)
    assert batch.input_ids[0, positions + 1].tolist() == [8, 9, 10]  # exactly the model's tokens
    assert batch.loss_mask.sum() == 5  # 3 model + 2 single-turn tokens
    torch.testing.assert_close(batch.advantages, torch.tensor([0.707106, -0.707106]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("mask, got", [([1, 0], "2 values \\[0, 1\\]"), ([1, 2, 1], "3 values \\[1, 2\\]")])
def test_bad_completion_mask(mask, got):
    t = _traj(0, 0, [1], [2, 3, 4], [-1.0, 0.0, -1.0], 0.0)
    t.completion_mask = mask
    with pytest.raises(ValueError, match=f"one 0/1 per completion token \\(3\\), got {got}"):
        build_train_batch([TrajectoryGroup(0, "", {}, [t, _traj(0, 1, [1], [2], [-1.0], 1.0)])], 0)


def _sized_group(prompt_id, rewards, lengths=None):
    """One group whose completions have the given rewards and lengths (tokens of id 5)."""
    lengths = lengths or [1] * len(rewards)
    return TrajectoryGroup(
        prompt_id,
        f"p{prompt_id}",
        {},
        [_traj(prompt_id, i, [1, 2], [5] * n, [-0.5] * n, r) for i, (r, n) in enumerate(zip(rewards, lengths))],
    )


def test_overlong_shaping_enters_rewards_before_advantages():
    # completions of 1, 3 | 4, 2 tokens; L_max 4, L_cache 2 (soft limit 2): penalties 0, -.5 | -1, 0
    # rewards 1, 1 | 1, 0 -> shaped 1, .5 | 0, 0
    # dr_grpo: group a mean .75 -> .25, -.25 ; group b: equal -> 0, 0
    groups = [_sized_group(0, [1.0, 1.0], [1, 3]), _sized_group(1, [1.0, 0.0], [4, 2])]
    shaping = lambda n: overlong_penalty(n, max_len=4, buffer_len=2)  # noqa: E731
    batch = build_train_batch(groups, pad_token_id=0, estimator="dr_grpo", reward_shaping=shaping)
    torch.testing.assert_close(batch.rewards, torch.tensor([1.0, 0.5, 0.0, 0.0]))
    torch.testing.assert_close(batch.advantages, torch.tensor([0.25, -0.25, 0.0, 0.0]))
    plain = build_train_batch(groups, pad_token_id=0, estimator="dr_grpo")
    torch.testing.assert_close(plain.rewards, torch.tensor([1.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(plain.advantages, torch.tensor([0.0, 0.0, 0.5, -0.5]))


def test_critic_estimator_leaves_advantages_to_the_trainer():
    batch = build_train_batch([_sized_group(0, [1.0, 0.5], [2, 3])], pad_token_id=0, estimator="gae")
    assert batch.advantages.tolist() == [0.0, 0.0]
    torch.testing.assert_close(batch.rewards, torch.tensor([1.0, 0.5]))
    with pytest.raises(ValueError, match="gae"):
        build_train_batch([_sized_group(0, [1.0, 0.5])], pad_token_id=0, estimator="ppo")
