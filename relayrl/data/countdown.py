"""Countdown, as TinyZero trains it: reach a target from 3 or 4 given numbers with + - * /.

A row is ``{"question", "answer": "<target>", "nums": [...], "target": int, "solution": "<expr>"}``.
Each problem is solvable by construction: its numbers are combined, in a random order with random
operators, into an expression whose exact value (``Fraction``; intermediate fractions allowed) is a
whole number in ``[1, TARGET_MAX]``; that value is the target and the expression the ``solution``.
``rewards.tasks.countdown_correct`` checks a completion's ``<answer>`` expression against ``nums`` and
``target`` (TinyZero's rule: every number used exactly once).
"""

from __future__ import annotations

import random
from fractions import Fraction

COUNTDOWN_QUESTION = (
    "Using the numbers {nums}, create an equation that equals {target}. You can use basic arithmetic "
    "operations (+, -, *, /) and each number must be used exactly once. Show your work in <think> </think> "
    "tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
)
"""TinyZero's prompt, as one user turn (``{nums}`` is the list, ``{target}`` the number)."""
COUNTS = (3, 4)
"""How many numbers a problem gives (TinyZero's Countdown-Tasks-3to4)."""
TARGET_MAX = 1000
"""Targets are whole numbers in [1, TARGET_MAX]; a draw outside is drawn again."""
OPS = ("+", "-", "*", "/")


def make_countdown_rows(n: int, max_number: int, seed: int | str, ops: tuple[int, ...] = ()) -> list[dict]:
    """``n`` problems with numbers uniform in ``[1, max_number]``, seeded: same arguments, same rows. ``ops``: how
    many operations a problem takes (its numbers less one), drawn from these; empty: ``COUNTS``' numbers."""
    if n <= 0 or max_number < 1:
        raise ValueError(
            f"countdown needs num_prompts > 0 and max_operand >= 1, got {n} and {max_number}; "
            "set data.num_prompts / data.max_operand"
        )
    rng = random.Random(f"relayrl-countdown/{seed}")
    counts = tuple(k + 1 for k in ops) or COUNTS
    return [_problem(rng, max_number, counts) for _ in range(n)]


def _problem(rng: random.Random, max_number: int, counts: tuple[int, ...]) -> dict:
    """Draw numbers and an expression over them until its value is a whole number in [1, TARGET_MAX]."""
    while True:
        nums = [rng.randint(1, max_number) for _ in range(rng.choice(counts))]
        value, text = _combine(rng, nums)
        if value is not None and value.denominator == 1 and 1 <= value <= TARGET_MAX:
            target = int(value)
            return {
                "question": COUNTDOWN_QUESTION.format(nums=nums, target=target),
                "answer": str(target),
                "nums": nums,
                "target": target,
                "solution": text,
            }


def _combine(rng: random.Random, nums: list[int]) -> tuple[Fraction | None, str]:
    """Join two random terms with a random operator until one term is left: ``(value, expression)``;
    value None where a division by zero came up."""
    terms: list[tuple[Fraction, str]] = [(Fraction(x), str(x)) for x in nums]
    while len(terms) > 1:
        (a, ta), (b, tb) = terms.pop(rng.randrange(len(terms))), terms.pop(rng.randrange(len(terms)))
        op = rng.choice(OPS)
        if op == "/" and b == 0:
            return None, ""
        value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
        terms.append((value, f"({ta} {op} {tb})"))
    value, text = terms[0]
    return value, text[1:-1] if text.startswith("(") else text


def worked_answer(row: dict) -> str:
    """The reply a supervised warm start teaches for ``row``: the solution and its value in ``<think>``, the
    expression in ``<answer>``."""
    return f"<think> {row['solution']} = {row['target']} </think> <answer> {row['solution']} </answer>"
