"""Generated Countdown and word-problem tasks: seeded, solvable by construction, answers that the task
rewards accept."""

from __future__ import annotations

import pytest

from relayrl.config import ConfigError, DataConfig
from relayrl.data import load_task
from relayrl.data.countdown import make_countdown_rows
from relayrl.data.wordproblem import INSTRUCTION, MAX_STEPS, MIN_STEPS, make_wordproblem_rows
from relayrl.rewards.tasks import answer_tag_correct, countdown_correct, countdown_value, think_answer_format


def test_countdown_rows_are_seeded_and_solvable_by_their_solution():
    rows = make_countdown_rows(200, 25, seed=3)
    assert rows == make_countdown_rows(200, 25, seed=3) and rows != make_countdown_rows(200, 25, seed=4)
    for row in rows:
        assert len(row["nums"]) in (3, 4) and all(1 <= x <= 25 for x in row["nums"])
        assert 1 <= row["target"] <= 1000 and row["answer"] == str(row["target"])
        assert f"{row['nums']}" in row["question"] and f"equals {row['target']}." in row["question"]
        assert countdown_value(row["solution"], row["nums"]) == row["target"]
    solved = [f"<think>.</think><answer>{r['solution']}</answer>" for r in rows]
    assert countdown_correct([""] * 200, solved, [r["nums"] for r in rows], [r["target"] for r in rows]) == [1.0] * 200


def test_wordproblem_rows_chain_two_to_four_whole_number_steps():
    rows = make_wordproblem_rows(300, 9, seed=0)
    assert rows == make_wordproblem_rows(300, 9, seed=0)
    for row in rows:
        steps = row["solution"].split("; ")
        assert MIN_STEPS <= len(steps) <= MAX_STEPS
        value = int(steps[0].split()[0])
        assert f"has {value} " in row["question"]
        for step in steps:  # "a op b = c": recompute each step from the text
            a, op, b, _, c = step.split()
            assert int(a) == value and int(c) >= 1
            value = {"+": value + int(b), "-": value - int(b), "*": value * int(b)}.get(op, value // int(b))
            assert value == int(c) and (op != "/" or int(a) % int(b) == 0)
        assert row["answer"] == str(value) and row["question"].endswith(INSTRUCTION)


def test_wordproblem_worked_example():
    # seed 0's first problem, worked by hand from its sentences: 8 / 2 = 4, + 9 = 13, + 4 = 17, - 5 = 12
    row = make_wordproblem_rows(1, 9, seed=0)[0]
    assert row["question"].startswith(
        "Dan has 8 stickers. Dan splits the stickers into 2 equal groups and keeps "
        "one group. Dan finds 9 more stickers. Dan finds 4 more stickers. Dan gives "
        "5 stickers to a friend. How many stickers does Dan have now?"
    )
    assert row["answer"] == "12"
    good = "<think>8 / 2 = 4, 4 + 9 = 13, 13 + 4 = 17, 17 - 5 = 12</think>\n<answer>12</answer>"
    assert answer_tag_correct([""], [good], ["12"]) == [1.0] and think_answer_format([""], [good]) == [1.0]


def test_load_task_generates_the_configured_task():
    rows = load_task(DataConfig(task="countdown", num_prompts=5, max_operand=9, seed=1))
    assert rows == make_countdown_rows(5, 9, 1)
    assert load_task(DataConfig(task="wordproblem", num_prompts=4, seed=2)) == make_wordproblem_rows(4, 9, 2)


def test_ops_sets_the_operations_per_problem():
    cd = load_task(DataConfig(task="countdown", num_prompts=100, max_operand=9, ops=[1]))
    assert {len(r["nums"]) for r in cd} == {2}
    assert all(countdown_value(r["solution"], r["nums"]) == r["target"] for r in cd)
    wp = load_task(DataConfig(task="wordproblem", num_prompts=100, ops=[1, 2]))
    assert {len(r["solution"].split("; ")) for r in wp} == {1, 2}
    default = load_task(DataConfig(task="countdown", num_prompts=100))
    assert default == make_countdown_rows(100, 9, 0)  # no ops: the rows drawn before the field existed


@pytest.mark.parametrize(
    "kwargs, match",
    [({"task": "arith", "ops": [1]}, "data.ops applies to countdown and wordproblem"), ({"ops": [0]}, r">= 1")],
)
def test_ops_errors_name_the_field(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DataConfig(**{"task": "wordproblem", **kwargs})
