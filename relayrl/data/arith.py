"""Generated two-operand addition problems: a task with an exact, cheap-to-check answer.

A row is ``{"question": ..., "answer": "<int>"}``. The phrasing asks for ``Answer: N`` so that the
built-in rewards (``relayrl.rewards.builtin``) can read the number back without guessing.
"""

from __future__ import annotations

import random

ARITH_QUESTION = "What is {a} + {b}? Reply with 'Answer: N'."
"""Question template; ``{a}`` and ``{b}`` are the operands. Change it here to re-phrase the task."""


def make_arith_rows(n: int, max_operand: int, seed: int | str) -> list[dict[str, str]]:
    """Return ``n`` problems ``a + b`` with ``a, b`` uniform in ``[0, max_operand]``, seeded.

    The same ``(n, max_operand, seed)`` always gives the same rows, so a resumed run sees the same
    prompts. Duplicates are allowed (with ``max_operand=50`` there are only 51**2 distinct problems).
    """
    if n <= 0:
        raise ValueError(f"make_arith_rows needs n > 0, got {n}; set data.num_prompts to a positive number")
    if max_operand < 0:
        raise ValueError(f"make_arith_rows needs max_operand >= 0, got {max_operand}; set data.max_operand>=0")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        rows.append({"question": ARITH_QUESTION.format(a=a, b=b), "answer": str(a + b)})
    return rows


MULTIPLY_QUESTION = "What is {a} * {b}? Reply with 'Answer: N'."
"""Question template of the ``multiply`` task."""


def make_multiply_rows(n: int, max_operand: int, seed: int | str) -> list[dict[str, str]]:
    """``n`` problems ``a * b`` with ``a, b`` uniform in ``[2, max_operand]``, seeded (as ``make_arith_rows``).

    With ``max_operand=999`` most are 3-digit by 3-digit products, which SmolLM2-135M cannot compute in its
    head but can read off a calculator: the tool-use task of ``recipes/agent_calc.yaml``.
    """
    if n <= 0 or max_operand < 2:
        raise ValueError(
            f"make_multiply_rows needs n > 0 and max_operand >= 2, got n={n}, max_operand={max_operand}; "
            "set data.num_prompts and data.max_operand"
        )
    rng = random.Random(f"multiply/{seed}")
    rows = []
    for _ in range(n):
        a, b = rng.randint(2, max_operand), rng.randint(2, max_operand)
        rows.append({"question": MULTIPLY_QUESTION.format(a=a, b=b), "answer": str(a * b)})
    return rows
