"""longest_prompt: the row with the most formatted-prompt tokens, duplicates reported at their first row."""

from __future__ import annotations

from typing import Any

import pytest

from relayrl.data.lengths import check_row_budgets, longest_prompt, row_max_tokens


def words(texts: list[str]) -> dict[str, list[list[int]]]:
    """A tokenizer with one token per word plus a BOS, called on a batch as HF tokenizers are."""
    return {"input_ids": [[0] + [1] * len(t.split()) for t in texts]}


def test_every_row_counts_with_the_template_and_duplicates_name_their_first_row():
    rows = [{"question": q} for q in ("a b", "a b c d", "x", "a b c d", "aaaaaaaaaaaa")]
    found = longest_prompt(rows, words, lambda q: f"<user> {q} <assistant>")
    assert (found.row, found.tokens, found.question) == (1, 1 + 4 + 2, "a b c d")


def test_a_limit_checks_the_longest_questions_by_characters():
    rows = [{"question": q} for q in ("a b c d e", "x" * 20, "yy")]
    assert longest_prompt(rows, words, str, limit=1).row == 1  # only "xxx..." (1 word) was tokenized
    assert longest_prompt(rows, words, str, limit=2).row == 0


def test_a_rows_max_tokens_caps_its_budget_below_the_rollouts():
    assert row_max_tokens({"question": "q"}, 64) == 64  # no column: rollout.max_tokens
    assert row_max_tokens({"max_tokens": 20}, 64) == 20
    assert row_max_tokens({"max_tokens": 100}, 64) == 64  # never above rollout.max_tokens


@pytest.mark.parametrize("bad", [0, -3, 4, 7.5, "12", True])
def test_a_budget_that_is_not_an_integer_of_at_least_min_tokens_names_its_row(bad: object):
    rows: list[dict[str, Any]] = [{"max_tokens": 9}, {"question": "q"}, {"max_tokens": bad}]
    with pytest.raises(ValueError, match=r"^row 2: its max_tokens column is .*, not an integer >= 5 "):
        check_row_budgets(rows, min_tokens=5)
    check_row_budgets(rows[:2], min_tokens=5)  # 9 >= 5, and a row without the column is fine
