import math

import pytest

from relayrl.rewards import RewardError, reward_metrics, score_groups
from relayrl.rewards.builtin import answer_format, arith_correct
from relayrl.types import Trajectory, TrajectoryGroup


def traj(text: str, i: int = 0) -> Trajectory:
    return Trajectory(prompt_id=0, sample_idx=i, prompt_token_ids=[1], completion_token_ids=[2],
                      behaviour_logprobs=[-0.5], completion_text=text, finish_reason="stop", versions=[])


def group(pid: int, answer: str, *texts: str) -> TrajectoryGroup:
    return TrajectoryGroup(prompt_id=pid, prompt=f"prompt{pid}", columns={"answer": answer, "question": f"q{pid}"},
                           trajectories=[traj(t, i) for i, t in enumerate(texts)])


def batch() -> list[TrajectoryGroup]:
    return [group(0, "12", "Answer: 12", "Answer: 13", "twelve"),
            group(1, "-4", "Answer: -4", "Answer: -4.")]


FNS = [("arith_correct", arith_correct, 1.0), ("answer_format", answer_format, 0.5)]


def test_weighted_sum_and_breakdown():
    groups = score_groups(batch(), FNS)
    got = [(t.rewards, t.reward) for g in groups for t in g.trajectories]
    assert got == [
        ({"arith_correct": 1.0, "answer_format": 1.0}, 1.5),
        ({"arith_correct": 0.0, "answer_format": 1.0}, 0.5),
        ({"arith_correct": 0.0, "answer_format": 0.0}, 0.0),
        ({"arith_correct": 1.0, "answer_format": 1.0}, 1.5),
        ({"arith_correct": 1.0, "answer_format": 1.0}, 1.5),
    ]


def test_each_fn_called_once_with_columns_broadcast_per_completion():
    calls = []

    def spy(prompts, completions, **columns):
        calls.append((prompts, completions, columns))
        return [0.0] * len(completions)

    score_groups(batch(), [("spy", spy, 1.0)])
    assert calls == [(["prompt0"] * 3 + ["prompt1"] * 2,
                      ["Answer: 12", "Answer: 13", "twelve", "Answer: -4", "Answer: -4."],
                      {"answer": ["12"] * 3 + ["-4"] * 2, "question": ["q0"] * 3 + ["q1"] * 2})]


def test_rescoring_replaces_previous_rewards():
    groups = score_groups(batch(), FNS)
    score_groups(groups, [("answer_format", answer_format, 2.0)])
    assert [t.reward for g in groups for t in g.trajectories] == [2.0, 2.0, 0.0, 2.0, 2.0]
    assert list(groups[0].trajectories[0].rewards) == ["answer_format"]


def boom(prompts, completions, **_):
    raise KeyError("answer")


@pytest.mark.parametrize("fn, message", [
    (boom, r"reward 'bad' raised KeyError: 'answer'; fix the function"),
    (lambda p, c, **_: [1.0], r"reward 'bad' returned 1 values for 5 completions; return one float per"),
    (lambda p, c, **_: [1.0, 1.0, math.nan, 0.0, 0.0], r"reward 'bad' returned nan at index 2 for 'twelve'"),
    (lambda p, c, **_: [1.0, None, 1.0, 0.0, 0.0], r"reward 'bad' returned None at index 1; return a float"),
    (lambda p, c, **_: 1.0, r"reward 'bad' returned float; return a list of floats"),
])
def test_bad_reward_functions_raise_reward_error_naming_them(fn, message):
    with pytest.raises(RewardError, match=message) as info:
        score_groups(batch(), [("ok", answer_format, 1.0), ("bad", fn, 1.0)])
    assert "\n" not in str(info.value)


def test_empty_batch_calls_nothing():
    assert score_groups([], [("bad", boom, 1.0)]) == []
    assert reward_metrics([]) == {}


def test_reward_metrics_by_hand():
    # totals: 1.5, 0.5, 0.0 | 1.5, 1.5 -> mean 5/5 = 1.0; deviations .5, -.5, -1, .5, .5 -> var (0.25*4+1)/5 = 0.4
    m = reward_metrics(score_groups(batch(), FNS))
    assert m["reward/mean"] == pytest.approx(1.0)
    assert m["reward/std"] == pytest.approx(math.sqrt(0.4))
    assert m["reward/arith_correct"] == pytest.approx(3 / 5)
    assert m["reward/answer_format"] == pytest.approx(4 / 5)
    assert m["reward/pass_rate"] == pytest.approx(3 / 5)           # first fn (arith_correct) >= 1
    assert m["reward/zero_std_groups"] == pytest.approx(1 / 2)     # group 1: both 1.5
    assert reward_metrics(score_groups(batch(), FNS), primary="answer_format")["reward/pass_rate"] == 0.8
