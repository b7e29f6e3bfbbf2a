"""Prompt token lengths, measured before any engine starts.

A prompt that does not fit the engine's context fails the same way on every replica and every retry, so
it is found here, in the driver, with the tokenizer and chat template the sampler uses: vLLM encodes a
text prompt with the tokenizer's special tokens added, and so does ``longest_prompt``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relayrl.data.sampler import prompt_text

MAX_GENERATED_CHECKED = 8192
"""Generated tasks: at most this many distinct questions are tokenized, the longest by characters
(a generator's rows differ in a few numbers, so the longest texts hold the longest token counts)."""


@dataclass(frozen=True)
class LongestPrompt:
    row: int  # index into the dataset's rows (for a file: its n-th non-blank line, from 0)
    tokens: int  # prompt tokens after the chat template, special tokens included
    question: str


def longest_prompt(
    rows: list[dict[str, Any]], tokenizer: Any, format_prompt: Callable[[Any], str], limit: int | None = None
) -> LongestPrompt:
    """The row whose formatted prompt has the most tokens. ``limit=None`` checks every row (files);
    a number checks that many distinct questions, the longest by characters first (generated tasks)."""
    first_row: dict[str, int] = {}
    for i, row in enumerate(rows):
        first_row.setdefault(prompt_text(row["question"]), i)
    questions = sorted(first_row, key=len, reverse=True)[:limit]
    prompts = [format_prompt(rows[first_row[q]]["question"]) for q in questions]
    counts = [len(ids) for ids in tokenizer(prompts)["input_ids"]]
    best = max(range(len(questions)), key=counts.__getitem__)
    return LongestPrompt(first_row[questions[best]], counts[best], questions[best])


ROW_MAX_TOKENS = "max_tokens"
"""A row's own completion budget: the column that caps its completions below ``rollout.max_tokens`` (a task
whose right answer's length is known, such as ``count``, gives each problem room for it and no more)."""


def row_max_tokens(row: dict[str, Any], max_tokens: int) -> int:
    """Tokens a completion of ``row`` may take: its ``max_tokens`` column, at most ``max_tokens``
    (``rollout.max_tokens``); a row without that column gets ``max_tokens``."""
    own = row.get(ROW_MAX_TOKENS)
    return max_tokens if own is None else min(int(own), max_tokens)


def check_row_budgets(rows: list[dict[str, Any]], min_tokens: int) -> None:
    """Every row's ``max_tokens`` column, where set, is an integer of at least 1 and at least ``min_tokens``
    (``rollout.min_tokens``); ``ValueError`` names the first row that is not."""
    for i, row in enumerate(rows):
        own = row.get(ROW_MAX_TOKENS)
        if own is None:
            continue
        if isinstance(own, bool) or not isinstance(own, int) or own < max(1, min_tokens):
            raise ValueError(
                f"row {i}: its max_tokens column is {own!r}, not an integer >= {max(1, min_tokens)} "
                f"(rollout.min_tokens={min_tokens}); lower rollout.min_tokens, or fix the row or drop the column"
            )
