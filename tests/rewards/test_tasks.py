"""Tagged-answer rewards against hostile completions: exactly one well-formed block counts, and a
Countdown answer is parsed (never run), uses each given number once and equals the target exactly."""

from __future__ import annotations

from fractions import Fraction

import pytest

from relayrl.rewards import REWARDS
from relayrl.rewards.tasks import (
    answer_block,
    answer_tag_correct,
    countdown_correct,
    countdown_value,
    think_answer_format,
)


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<think>2 + 3 = 5</think> <answer>5</answer>", 1.0),
        ("\n  <think>a</think>\n<answer> 5 </answer>\n", 1.0),
        ("<think></think><answer>5</answer>", 0.0),  # blank reasoning
        ("<think>a</think><answer>  </answer>", 0.0),  # blank answer
        ("<think>a</think><answer>5</answer><answer>6</answer>", 0.0),  # repeated answer
        ("<think>a</think><think>b</think><answer>5</answer>", 0.0),  # repeated think
        ("<think>a <think>b</think> c</think><answer>5</answer>", 0.0),  # nested think
        ("<think>a <answer>4</answer></think><answer>5</answer>", 0.0),  # answer hidden in think
        ("<think>a</think><answer>5 <think>x</think></answer>", 0.0),  # think inside answer
        ("<answer>5</answer><think>a</think>", 0.0),  # wrong order
        ("Sure! <think>a</think><answer>5</answer>", 0.0),  # text before
        ("<think>a</think><answer>5</answer> trailing", 0.0),  # text after
        ("<think>a</think>5", 0.0),  # no answer block
        ("<think>a</answer><answer>5</think>", 0.0),  # crossed tags
    ],
)
def test_think_answer_format(completion, expected):
    assert think_answer_format([""], [completion]) == [expected]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>12</answer>", "12"),
        ("junk <answer> 3 + 4 </answer> junk", "3 + 4"),
        ("<answer>1</answer><answer>2</answer>", None),  # two candidates
        ("<answer>1", None),
        ("</answer>1<answer>", None),  # closing before opening
        ("<answer><answer>1</answer>", None),
        ("<answer><think>1</think></answer>", None),
    ],
)
def test_answer_block_takes_only_a_single_block(completion, expected):
    assert answer_block(completion) == expected


def test_answer_tag_correct_reads_one_integer():
    completions = [
        "<think>7 - 6 = 1</think><answer>15</answer>",
        "<answer>1,500</answer>",
        "<answer>15.</answer>",
        "<answer>15 apples</answer>",
        "<answer>14</answer> <answer>15</answer>",
        "Answer: 15",
        "<answer>-3</answer>",
    ]
    answers = ["15", "1500", "15", "15", "15", "15", "-3"]
    assert answer_tag_correct([""] * 7, completions, answers) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "expression, value",
    [
        ("(20 + 4) * 3", Fraction(72)),
        ("3 * (4 + 20)", Fraction(72)),  # any order of the numbers
        ("20 / 3 * 4", Fraction(80, 3)),  # exact, not 26.666...
        ("(20 - 4) / 3", Fraction(16, 3)),
        ("20 + 4 * 3", Fraction(32)),  # precedence as written
    ],
)
def test_countdown_value_of_valid_expressions(expression, value):
    assert countdown_value(expression, [20, 3, 4]) == value


@pytest.mark.parametrize(
    "expression",
    [
        "20 + 4",  # 3 not used
        "20 + 4 + 3 + 3",  # 3 used twice
        "20 + 43",  # digits glued into another number
        "20 * 4 - 3 + 0",  # a number not given
        "-20 + 4 * 3",  # unary minus
        "20 ** 3 + 4",
        "20 // 3 + 4",
        "20 % 3 + 4",  # other operators
        "2.0e1 + 3 + 4",
        "0x14 + 3 + 4",
        "2_0 + 3 + 4",  # other literal spellings of 20
        "__import__('os').system('x')",
        "[20, 3, 4]",  # code, containers
        "20 + 3 + 4 = 27",  # an equation, not an expression
        "(" * 300 + "20 + 3 + 4" + ")" * 300,  # too long / too deep
        "20 3 4",
        "",
        None,
    ],
)
def test_countdown_value_rejects_hostile_expressions(expression):
    assert countdown_value(expression, [20, 3, 4]) is None


def test_countdown_division_by_zero_scores_zero():
    assert countdown_value("3 / (4 - 4)", [3, 4, 4]) is None


def test_countdown_correct_compares_exactly_with_the_target():
    completions = [
        "<think>24 * 3</think><answer>(20 + 4) * 3</answer>",
        "<answer>(20 + 4) * 3</answer>",  # format is another reward
        "<answer>20 * 4 - 3</answer>",  # 77, not 72
        "<answer>(20 + 4) * 3</answer><answer>1</answer>",  # two answers
        "(20 + 4) * 3",
    ]  # no tags
    rewards = countdown_correct([""] * 5, completions, [[20, 3, 4]] * 5, [72] * 5)
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0]
    # 7 / 3 * 3 is 7 exactly in fractions (floats give 7.000000000000001 or 6.999...)
    assert countdown_correct([""], ["<answer>7 / 3 * 3</answer>"], [[7, 3, 3]], ["7"]) == [1.0]


def test_task_rewards_are_registered_by_name():
    assert REWARDS["countdown_correct"] is countdown_correct
    assert REWARDS["answer_tag_correct"] is answer_tag_correct
    assert REWARDS["think_answer_format"] is think_answer_format
