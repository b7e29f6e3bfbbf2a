"""Counting out loud: a task whose right answer is long and checked number by number.

A row is ``{"question": "List the numbers from 1 to N, ...", "answer": "<N>", "max_tokens": ...}``;
``rewards.tasks.count_correct`` scores the integers a completion writes against ``1, 2, ..., N``. It is the
long-trace task: SmolLM2's tokenizer writes each digit, comma and space as its own token, so ``1, 2, ..., N``
takes ``count_tokens(N)`` tokens (N = 150: 640; N = 840: 4090), and the length a right answer needs is known
before sampling. ``N`` is drawn log-uniform in ``[MIN_COUNT, max_count]``: most problems are short, a few are
long (a long tail, as reasoning traces have). Each row's ``max_tokens`` column (``row_budget``) gives its
completions room for the right answer and a quarter as much again, so an answer that runs on past N stops
there instead of at ``rollout.max_tokens``.

Why commas: SmolLM2-135M-Instruct, asked for one number a line, mostly loops (``..., 28, 29, 20, 21, ...``) or
numbers its lines (``1. 1``). Asked for commas, about a quarter of its samples count right past N (probe of
2026-12-07, docs/benchmarks.md): a reward with spread in a group from the first step.
"""

from __future__ import annotations

import math
import random
from typing import Any

COUNT_QUESTION = "List the numbers from 1 to {n}, separated by commas, and nothing else."
"""Question template; ``{n}`` is where the count stops."""
MIN_COUNT = 150
"""The shortest count a problem asks for: 640 tokens."""
BUDGET_FACTOR = 1.25
"""A row's completion budget over its right answer's tokens."""


def count_tokens(n: int) -> int:
    """Tokens of ``1, 2, ..., n`` when every digit, comma and space is one token (SmolLM2's tokenizer)."""
    return sum(len(str(k)) for k in range(1, n + 1)) + 2 * (n - 1)


def row_budget(n: int) -> int:
    """The ``max_tokens`` of the row counting to ``n``: ``BUDGET_FACTOR`` times ``count_tokens(n)``, rounded up."""
    return math.ceil(BUDGET_FACTOR * count_tokens(n))


def worked_answer(row: dict[str, Any]) -> str:
    """The reply a supervised warm start teaches for ``row``: ``1, 2, ...`` up to its answer."""
    return ", ".join(str(k) for k in range(1, int(row["answer"]) + 1))


def make_count_rows(n: int, max_count: int, seed: int | str) -> list[dict[str, Any]]:
    """``n`` problems counting to N, N log-uniform in ``[MIN_COUNT, max_count]``, seeded: same arguments, same
    rows."""
    if n <= 0 or max_count < MIN_COUNT:
        raise ValueError(
            f"count needs num_prompts > 0 and max_operand >= {MIN_COUNT} (the longest count), got {n} and "
            f"{max_count}; set data.num_prompts / data.max_operand"
        )
    rng = random.Random(f"relayrl-count/{seed}")
    rows = []
    for _ in range(n):
        top = round(math.exp(rng.uniform(math.log(MIN_COUNT), math.log(max_count))))
        rows.append({"question": COUNT_QUESTION.format(n=top), "answer": str(top), "max_tokens": row_budget(top)})
    return rows
