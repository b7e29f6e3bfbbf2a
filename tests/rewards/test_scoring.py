"""In-process scoring: weighted totals, None = not applicable, failures exclude samples, error limit."""

import asyncio
import math

import pytest

from relayrl.rewards import RewardError, reward_metrics, score_groups
from relayrl.rewards.builtin import answer_format, arith_correct
from relayrl.rewards.scoring import RewardFns, Scored, check_error_rate, check_values
from relayrl.types import Exclusion, Trajectory, TrajectoryGroup, VersionSpan
from tests.rewards.flaky import flaky, read_spans, sleepy


def traj(text: str, i: int = 0) -> Trajectory:
    return Trajectory(
        prompt_id=0,
        sample_idx=i,
        prompt_token_ids=[1],
        completion_token_ids=[2],
        behaviour_logprobs=[-0.5],
        completion_text=text,
        finish_reason="stop",
        versions=[],
    )


def group(pid: int, answer: str, *texts: str, prompt: str | None = None) -> TrajectoryGroup:
    return TrajectoryGroup(
        prompt_id=pid,
        prompt=prompt or f"prompt{pid}",
        columns={"answer": answer, "question": f"q{pid}"},
        trajectories=[traj(t, i) for i, t in enumerate(texts)],
    )


def batch() -> list[TrajectoryGroup]:
    return [group(0, "12", "Answer: 12", "Answer: 13", "twelve"), group(1, "-4", "Answer: -4", "Answer: -4.")]


FNS: RewardFns = [("arith_correct", arith_correct, 1.0), ("answer_format", answer_format, 0.5)]


def test_weighted_sum_and_breakdown():
    groups = score_groups(batch(), FNS)
    got = [(t.rewards, t.reward, t.excluded) for g in groups for t in g.trajectories]
    assert got == [
        ({"arith_correct": 1.0, "answer_format": 1.0}, 1.5, None),
        ({"arith_correct": 0.0, "answer_format": 1.0}, 0.5, None),
        ({"arith_correct": 0.0, "answer_format": 0.0}, 0.0, None),
        ({"arith_correct": 1.0, "answer_format": 1.0}, 1.5, None),
        ({"arith_correct": 1.0, "answer_format": 1.0}, 1.5, None),
    ]


@pytest.mark.parametrize("groups_per_call, expected_calls", [(1, 2), (2, 1), (5, 1)])
def test_one_call_per_chunk_of_groups_with_columns_broadcast(groups_per_call, expected_calls):
    calls = []

    def spy(prompts, completions, **columns):
        calls.append((prompts, completions, columns))
        return [0.0] * len(completions)

    score_groups(batch(), [("spy", spy, 1.0)], groups_per_call=groups_per_call)
    assert len(calls) == expected_calls
    merged = (
        [p for c in calls for p in c[0]],
        [x for c in calls for x in c[1]],
        {k: [v for c in calls for v in c[2][k]] for k in ("answer", "question")},
    )
    assert merged == (
        ["prompt0"] * 3 + ["prompt1"] * 2,
        ["Answer: 12", "Answer: 13", "twelve", "Answer: -4", "Answer: -4."],
        {"answer": ["12"] * 3 + ["-4"] * 2, "question": ["q0"] * 3 + ["q1"] * 2},
    )


def test_rescoring_replaces_previous_rewards():
    groups = score_groups(batch(), FNS)
    score_groups(groups, [("answer_format", answer_format, 2.0)])
    assert [t.reward for g in groups for t in g.trajectories] == [2.0, 2.0, 0.0, 2.0, 2.0]
    assert list(groups[0].trajectories[0].rewards) == ["answer_format"]


def test_none_means_not_applicable_like_trl():
    """None adds nothing to the total (TRL's nansum), all-None totals 0.0, per-function means skip None."""

    def half(prompts, completions, **_):
        return [1.0 if c.startswith("Answer") else None for c in completions]

    groups = score_groups(batch(), [("half", half, 2.0), ("fmt", answer_format, 1.0)])
    assert [t.rewards["half"] for g in groups for t in g.trajectories] == [1.0, 1.0, None, 1.0, 1.0]
    assert [t.reward for g in groups for t in g.trajectories] == [3.0, 3.0, 0.0, 3.0, 3.0]
    assert all(t.excluded is None for g in groups for t in g.trajectories)
    m = reward_metrics(groups)
    assert m["reward/half"] == 1.0  # mean over the 4 where it applied, not 4/5
    assert m["reward/errors"] == 0.0


@pytest.mark.parametrize(
    "raw, values, reasons",
    [
        ([1, 0.5, None], [1.0, 0.5, None], [None, None, None]),
        ([1.0, math.nan, math.inf], [1.0, None, None], [None, "non_finite", "non_finite"]),
        ([1.0, "2", object()], [1.0, None, None], [None, "not_a_number", "not_a_number"]),
        ([1.0, 1.0], [None] * 3, ["wrong_length"] * 3),
        (1.0, [None] * 3, ["not_a_list"] * 3),
        ({"a": 1, "b": 2, "c": 3}, [None] * 3, ["not_a_list"] * 3),
    ],
)
def test_check_values(raw, values, reasons):
    result = check_values(raw, 3)
    assert (result.values, result.reasons) == (values, reasons)


@pytest.mark.parametrize(
    "prompt, excluded, reason, detail",
    [
        ("raise", [0, 1, 2], "raised", "raised KeyError: 'answer'"),
        ("nan", [0], "non_finite", "returned nan at index 0"),
        ("short", [0, 1, 2], "wrong_length", "returned 2 values for 3 completions"),
        ("text", [0, 1, 2], "not_a_list", "returned str, not a list of floats"),
    ],
)
def test_a_failing_call_excludes_only_its_samples(prompt, excluded, reason, detail):
    groups = [group(0, "1", "a", "bb", "ccc", prompt=prompt), group(1, "1", "dd", "e", "fff")]
    score_groups(groups, [("flaky", flaky, 1.0), ("fmt", answer_format, 1.0)])
    first, second = groups
    assert [i for i, t in enumerate(first.trajectories) if t.excluded] == excluded
    assert all(
        t.excluded == Exclusion("flaky", reason, detail) and t.reward == 0.0 for t in first.trajectories if t.excluded
    )
    assert [t.reward for t in second.trajectories] == [2.0, 1.0, 3.0]  # the other group is untouched
    m = reward_metrics(groups)
    assert m["reward/errors"] == len(excluded) and m[f"reward/errors/{reason}"] == len(excluded)
    assert m["reward/error_rate"] == pytest.approx(len(excluded) / 6)
    assert m["reward/dropped_groups"] == (1.0 if len(excluded) == 3 else 0.0)
    # statistics cover the scored samples only: 2, 1, 3 (+ 1, 1 from the nan group: flaky gives [nan, 1, 1])
    assert m["reward/mean"] == pytest.approx(2.0 if len(excluded) == 3 else 8 / 5)


def test_error_rate_above_limit_aborts_in_one_line():
    groups = [group(0, "1", "a", "b", prompt="raise"), group(1, "1", "c", "d")]
    score_groups(groups, [("flaky", flaky, 1.0)], max_error_rate=0.5)  # 2 of 4 = 50%: not above the limit
    with pytest.raises(RewardError) as info:
        score_groups(groups, [("flaky", flaky, 1.0)], max_error_rate=0.49)
    assert str(info.value) == (
        "rewards failed on 2 of 4 completions (50% > reward.max_error_rate=0.49); first: "
        "reward 'flaky' raised: raised KeyError: 'answer'; fix the reward function or "
        "raise reward.max_error_rate"
    )


def test_nothing_left_to_train_on_aborts():
    groups = [group(0, "1", "a", "b", prompt="nan"), group(1, "1", "c", "d", prompt="nan")]
    with pytest.raises(RewardError, match=r"^no prompt group has 2 scored completions left to train on \(2 of 4"):
        score_groups(groups, [("flaky", flaky, 1.0)], max_error_rate=0.5)
    check_error_rate(score_groups(batch(), FNS), 0.0)  # no errors: never aborts


def test_async_rewards_run_concurrently_in_process(tmp_path):
    """All 8 calls were running at once: the last to start began before the first to end finished.
    Awaited one by one, each would end before the next began, on any machine."""
    groups = [group(i, "1", "a", "b") for i in range(8)]
    for g in groups:
        g.columns["spans"] = str(tmp_path / "spans")
    score_groups(groups, [("sleepy", sleepy, 1.0)])
    spans = read_spans(tmp_path / "spans")
    assert len(spans) == 8 and max(s for _, s, _ in spans) < min(e for _, _, e in spans)
    assert all(t.reward == 1.0 for g in groups for t in g.trajectories)


def test_async_callable_object_and_sync_mix():
    class Scaled:
        async def __call__(self, prompts, completions, **_):
            await asyncio.sleep(0)
            return [2.0] * len(completions)

    groups = score_groups(
        batch(), [("scaled", Scaled(), 1.0), ("fmt", answer_format, 1.0), ("dup", answer_format, 1.0)]
    )
    assert list(groups[0].trajectories[0].rewards) == ["scaled", "fmt", "dup"]
    assert [t.reward for g in groups for t in g.trajectories] == [4.0, 4.0, 2.0, 4.0, 4.0]


def test_duplicate_names_get_suffixes():
    groups = score_groups(batch(), [("fmt", answer_format, 1.0), ("fmt", answer_format, 1.0)])
    assert list(groups[0].trajectories[0].rewards) == ["fmt", "fmt_1"]


def test_empty_batch_calls_nothing():
    assert score_groups([], [("bad", flaky, 1.0)]) == []
    assert reward_metrics([]) == {}


def test_reward_metrics_by_hand():
    # totals: 1.5, 0.5, 0.0 | 1.5, 1.5 -> mean 5/5 = 1.0; deviations .5, -.5, -1, .5, .5 -> var (0.25*4+1)/5 = 0.4
    m = reward_metrics(score_groups(batch(), FNS))
    assert m["reward/mean"] == pytest.approx(1.0)
    assert m["reward/std"] == pytest.approx(math.sqrt(0.4))
    assert m["reward/arith_correct"] == pytest.approx(3 / 5)
    assert m["reward/answer_format"] == pytest.approx(4 / 5)
    assert m["reward/pass_rate"] == pytest.approx(3 / 5)  # first fn (arith_correct) >= 1
    assert m["reward/zero_std_groups"] == pytest.approx(1 / 2)  # group 1: both 1.5
    assert m["reward/errors"] == 0.0 and m["reward/error_rate"] == 0.0 and m["reward/dropped_groups"] == 0.0
    assert reward_metrics(score_groups(batch(), FNS), primary="answer_format")["reward/pass_rate"] == 0.8


def test_scored_fields_come_from_the_groups_not_the_metrics():
    groups = score_groups(batch(), FNS)  # group 0 totals 1.5, 0.5, 0.0 vary; group 1 all 1.5
    groups[0].trajectories[0].versions = [VersionSpan(2, 0, 1), VersionSpan(3, 1, 1)]
    groups[1].trajectories[0].versions = [VersionSpan(2, 0, 1)]
    for g in groups:  # the rest were generated at version 2 as well
        for t in g.trajectories[1:]:
            t.versions = [VersionSpan(2, 0, 1)]
    scored = Scored.of(groups, {"reward/spread_groups": 99.0})
    assert (scored.useful, scored.min_version, scored.max_version) == (1, 2, 3)
    assert reward_metrics(groups)["reward/spread_groups"] == 1.0
    assert (Scored.of([], {}).useful, Scored.of([], {}).min_version) == (0, 0)


def test_total_that_overflows_to_inf_is_excluded_like_nan():
    """1e308 * 10 = inf (float max is ~1.8e308): that total would make its group's advantages NaN;
    1e308 * 0.5 = 5e307 is finite and stays (the mean of two of them, 1e308, is finite too)."""

    def big(prompts, completions, **_):
        return [10.0 if c == "b" else 0.5 for c in completions]

    groups = [group(0, "1", "a", "b", "c")]
    score_groups(groups, [("big", big, 1e308)])
    [a, b, c] = groups[0].trajectories
    assert (a.reward, c.reward, a.excluded, c.excluded) == (5e307, 5e307, None, None)
    assert b.excluded == Exclusion("total", "non_finite", "weighted total inf is not finite") and b.reward == 0.0
    m = reward_metrics(groups)
    assert m["reward/errors/non_finite"] == 1.0 and m["reward/mean"] == 5e307


SCORER_PROCESS = """
import sys
from relayrl.rewards import reward_metrics, score_groups
from relayrl.rewards.builtin import arith_correct
import relayrl.rewards.pool
from relayrl.types import Trajectory, TrajectoryGroup

def fails_on_boom(prompts, completions, **kw):
    if any("boom" in c for c in completions):
        raise ValueError("boom")
    return [0.0] * len(completions)

t = lambda text, i: Trajectory(0, i, [1], [2], [-0.5], text, "stop", [])
groups = [TrajectoryGroup(0, "p", {"answer": "12"}, [t("Answer: 12", 0), t("Answer: 13", 1)]),
          TrajectoryGroup(1, "p", {"answer": "3"}, [t("boom", 0), t("Answer: 3", 1)])]
score_groups(groups, [("arith_correct", arith_correct, 1.0), ("fails_on_boom", fails_on_boom, 1.0)])
metrics = reward_metrics(groups)
assert (metrics["reward/errors"], metrics["reward/dropped_groups"], metrics["reward/spread_groups"]) == (2, 1, 1)
print("torch" in sys.modules)
"""


def test_scoring_never_imports_torch():
    """The reward scorer and its workers are Ray workers that run this code; torch would cost each 1.5-2.7 s
    of a core at start-up on the 2-core box. Exclusions, the error check and every metric (dropped and
    spread groups) included."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SCORER_PROCESS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False"]
