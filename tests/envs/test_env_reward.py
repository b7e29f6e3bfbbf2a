"""Episode rewards reach reward functions (the env_reward column and built-in); the env config is validated."""

from __future__ import annotations

import pytest

from relayrl.config import ConfigError, load_config
from relayrl.rewards import REWARDS, RewardError, load_reward_fns, score_groups
from relayrl.rewards.scoring import flatten
from relayrl.types import Trajectory, TrajectoryGroup


def _group(env_rewards: list[float | None]) -> TrajectoryGroup:
    trajs = [
        Trajectory(0, i, [1], [2, 3], [-1.0, 0.0], f"Answer: {i}", "stop", [], completion_mask=[1, 0], env_reward=r)
        for i, r in enumerate(env_rewards)
    ]
    return TrajectoryGroup(0, "p", {"answer": "1"}, trajs)


def test_flatten_adds_env_reward_per_completion_only_for_episodes():
    batch = flatten([_group([1.0, 0.0]), _group([0.5])])
    assert batch.columns == {"answer": ["1", "1", "1"], "env_reward": [1.0, 0.0, 0.5]}
    assert flatten([_group([None, None])]).columns == {"answer": ["1", "1"]}  # single-turn: no new column


def test_env_reward_builtin_scores_with_weights_beside_other_rewards():
    assert REWARDS["env_reward"].__name__ == "env_reward"
    group = _group([1.0, 0.25, 0.0])
    score_groups([group], load_reward_fns([("env_reward", 2.0), ("arith_correct", 1.0)]))
    # totals: 2 * env + arith_correct ("Answer: i" vs answer 1 -> only sample 1 is right)
    assert [t.reward for t in group.trajectories] == [2.0, 1.5, 0.0]
    assert [t.rewards for t in group.trajectories][1] == {"env_reward": 0.25, "arith_correct": 1.0}


def test_env_reward_without_an_environment_excludes_with_a_clear_reason():
    with pytest.raises(RewardError, match=r"env_reward found no env_reward column.*set env\.name=calculator"):
        score_groups([_group([None, None])], load_reward_fns([("env_reward", 1.0)]))


def test_env_config():
    cfg = load_config("agent_calc_tiny")
    assert (cfg.env.name, cfg.env.max_turns, cfg.env.kwargs) == ("calculator", 3, {})
    assert load_config("grpo_tiny").env.name is None  # default: single-turn
    overridden = load_config("agent_calc_tiny", ["+env.kwargs.instructions='Use a tool.'", "env.episode_timeout_s=30"])
    assert overridden.env.kwargs == {"instructions": "Use a tool."} and overridden.env.episode_timeout_s == 30


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["env.name=nope"], "env.name: environment 'nope' is neither a built-in \\(calculator, python"),
        (["env.name=no_such_mod:Env"], "env.name: environment 'no_such_mod:Env': cannot import module"),
        (["env.max_turns=0"], "env.max_turns=0 must be >= 1"),
        (["env.episode_timeout_s=0"], "env.episode_timeout_s=0.0 must be > 0"),
        (["+env.kwargs.bogus=1"], "env.name: environment 'calculator' rejects kwargs=\\{'bogus': 1\\}"),
        (["env.name=null"], "rewards use env_reward but env.name is not set; set env.name=calculator"),
    ],
)
def test_bad_env_config(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("agent_calc_tiny", overrides)
