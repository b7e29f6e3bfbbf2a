"""longest_prompt: the row with the most formatted-prompt tokens, duplicates reported at their first row."""

from __future__ import annotations

from relayrl.data.lengths import longest_prompt


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
