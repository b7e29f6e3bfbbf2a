"""The counting task: seeded rows with a long tail of lengths, and a reward that only exactly 1..N earns."""

from __future__ import annotations

import re

import pytest

from relayrl.config import DataConfig
from relayrl.data import load_task, worked_examples
from relayrl.data.count import COUNT_QUESTION, MIN_COUNT, count_tokens, make_count_rows, row_budget
from relayrl.rewards import REWARDS
from relayrl.rewards.tasks import count_correct, count_score


def test_rows_are_seeded_and_ask_for_a_count_in_range():
    rows = make_count_rows(400, 1200, seed=3)
    assert rows == make_count_rows(400, 1200, seed=3) and rows != make_count_rows(400, 1200, seed=4)
    pattern = re.escape(COUNT_QUESTION).replace(r"\{n\}", r"(\d+)")
    tops = []
    for row in rows:
        top = int(re.fullmatch(pattern, row["question"]).group(1))
        assert row["answer"] == str(top) and MIN_COUNT <= top <= 1200
        tops.append(top)
    tops.sort()
    # log-uniform on [150, 1200]: the median is near sqrt(150 * 1200) = 424, far below a uniform draw's 675
    assert 350 < tops[200] < 500 and tops[-1] > 1000


def test_count_tokens_by_hand():
    assert count_tokens(3) == 7  # "1, 2, 3": 3 digits, 2 commas, 2 spaces
    assert count_tokens(12) == (9 + 3 * 2) + 2 * 11
    assert count_tokens(100) == (9 + 90 * 2 + 3) + 2 * 99


def test_each_row_gets_room_for_its_answer_and_a_quarter_as_much_again():
    assert row_budget(150) == 800  # count_tokens(150) = (9 + 90 * 2 + 51 * 3) + 2 * 149 = 640; 1.25 * 640
    assert row_budget(12) == 47  # count_tokens(12) = 15 + 22 = 37; 1.25 * 37 = 46.25, rounded up
    for row in make_count_rows(50, 1000, seed=0):
        assert row["max_tokens"] == row_budget(int(row["answer"]))


def test_the_warm_start_teaches_the_whole_count_which_scores_one():
    examples = worked_examples(DataConfig(task="count", num_prompts=5, max_operand=200), 3)
    for example in examples:
        n = int(re.search(r"to (\d+),", example["prompt"]).group(1))
        assert example["completion"] == ", ".join(map(str, range(1, n + 1)))
        assert count_score(example["completion"], n) == 1.0


def test_load_task_and_the_reward_registry_know_the_task():
    rows = load_task(DataConfig(task="count", num_prompts=5, max_operand=200))
    assert len(rows) == 5 and all(row["question"].startswith("List the numbers from 1 to ") for row in rows)
    assert REWARDS["count_correct"] is count_correct


def test_bad_range_names_the_field():
    with pytest.raises(ValueError, match=r"data\.max_operand"):
        make_count_rows(3, MIN_COUNT - 1, 0)


@pytest.mark.parametrize(
    "completion, score",
    [
        ("1\n2\n3\n4", 1.0),
        ("Sure! 1, 2, 3, 4.", 1.0),  # words and separators between the numbers are not scored
        ("1\n2\n3", 0.75),  # stopped short: 3 of 4
        ("1\n2\n4\n3", 0.5),  # a skip ends the run
        ("1\n2\n2\n3\n4", 0.4),  # so does a repeat, and the 5 integers written count against it
        ("1\n2\n3\n4\n5\n6\n7\n8", 0.5),  # past N: the extra numbers dilute the score
        ("01\n2\n3\n4", 0.0),  # compared as written: 01 is not 1
        ("-1\n-2\n-3\n-4", 0.0),
        ("1.2.3.4", 1.0),  # four integers, in order
        ("", 0.0),
        ("9" * 5000, 0.0),  # a number too long for int() is compared as a string, not converted
    ],
)
def test_count_score_by_hand(completion, score):
    assert count_score(completion, 4) == pytest.approx(score)


def test_count_correct_reads_the_answer_column():
    assert count_correct(["p", "p"], ["1 2 3", "1 2"], answer=["3", "4"]) == [1.0, 0.5]
