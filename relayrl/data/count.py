"""Counting out loud: a task whose right answer is long and checked number by number.

A row is ``{"question": "Count from 1 to N. ...", "answer": "<N>"}``; ``rewards.tasks.count_correct`` scores
the integers a completion writes against ``1, 2, ..., N``. It is the long-trace task: SmolLM2's tokenizer
writes each digit as its own token, so counting to N one number a line takes ``count_tokens(N)`` tokens
(N = 150: 492; N = 1000: 3893), and the length a right answer needs is known before sampling. ``N`` is drawn
log-uniform in ``[MIN_COUNT, max_count]``: most problems are short, a few are long (a long tail, as
reasoning traces have).
"""

from __future__ import annotations

import math
import random

COUNT_QUESTION = "Count from 1 to {n}. Write each number on its own line, and nothing else."
"""Question template; ``{n}`` is where the count stops."""
MIN_COUNT = 150
"""The shortest count a problem asks for: 492 tokens one number a line."""


def count_tokens(n: int) -> int:
    """Tokens of ``1\\n2\\n...\\nn`` when every digit and every newline is one token (SmolLM2's tokenizer)."""
    return sum(len(str(k)) + 1 for k in range(1, n + 1))


def make_count_rows(n: int, max_count: int, seed: int | str) -> list[dict[str, str]]:
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
        rows.append({"question": COUNT_QUESTION.format(n=top), "answer": str(top)})
    return rows
