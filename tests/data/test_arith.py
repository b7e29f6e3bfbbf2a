import re

import pytest

from relayrl.config import DataConfig
from relayrl.data import ARITH_QUESTION, load_task, make_arith_rows


def test_rows_are_correct_sums_in_range_and_seeded():
    rows = make_arith_rows(200, max_operand=9, seed=3)
    assert len(rows) == 200
    pattern = re.escape(ARITH_QUESTION).replace(r"\{a\}", r"(\d+)").replace(r"\{b\}", r"(\d+)")
    for row in rows:
        match = re.fullmatch(pattern, row["question"])
        assert match, row["question"]
        a, b = map(int, match.groups())
        assert 0 <= a <= 9 and 0 <= b <= 9
        assert row["answer"] == str(a + b)
    assert make_arith_rows(200, 9, seed=3) == rows
    assert make_arith_rows(200, 9, seed=4) != rows


def test_phrasing_asks_for_the_answer_format():
    assert make_arith_rows(1, 0, 0)[0] == {"question": "What is 0 + 0? Reply with 'Answer: N'.", "answer": "0"}


def test_bad_arguments_name_the_config_field():
    with pytest.raises(ValueError, match=r"data\.num_prompts"):
        make_arith_rows(0, 5, 0)
    with pytest.raises(ValueError, match=r"data\.max_operand"):
        make_arith_rows(3, -1, 0)


def test_load_task_dispatches(tmp_path):
    assert len(load_task(DataConfig(task="arith", num_prompts=7, max_operand=3))) == 7
    path = tmp_path / "t.jsonl"
    path.write_text('{"question": "q", "answer": "#### 5"}\n')
    assert load_task(DataConfig(task="jsonl", path=str(path)))[0]["answer"] == "5"
    with pytest.raises(ValueError, match=r"data\.path"):
        load_task(DataConfig(task="jsonl"))
