"""Multi-step word problems: 2-4 templated sentences of + - x / on one quantity, answered in tags.

A row is ``{"question", "answer": "<int>", "solution": "3 + 4 = 7; 7 * 2 = 14"}``. The question asks for
the reasoning inside ``<think> </think>`` and the number inside ``<answer> </answer>``: the format that
``rewards.tasks.think_answer_format`` pays for, and ``answer_tag_correct`` reads the number from.
Every step keeps the quantity a whole number >= 1 (a division only where it comes out even).
"""

from __future__ import annotations

import random

NAMES = ("Ava", "Ben", "Chloe", "Dan", "Ella", "Finn", "Grace", "Hugo", "Ivy", "Jack")
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "cards")
INSTRUCTION = (
    "Think step by step inside <think> </think> tags, then give only the final number inside "
    "<answer> </answer> tags, for example <think> 2 + 3 = 5 </think> <answer> 5 </answer>."
)
"""Closes every question; the example shows the exact shape ``think_answer_format`` pays for."""
MIN_STEPS, MAX_STEPS = 2, 4
TIMES = {2: "doubled", 3: "tripled"}


def make_wordproblem_rows(n: int, max_number: int, seed: int | str, ops: tuple[int, ...] = ()) -> list[dict[str, str]]:
    """``n`` problems whose quantities are drawn from ``[1, max_number]``, seeded; ``ops``: how many steps a problem
    takes, drawn from these (empty: MIN_STEPS to MAX_STEPS)."""
    if n <= 0 or max_number < 1:
        raise ValueError(
            f"wordproblem needs num_prompts > 0 and max_operand >= 1, got {n} and {max_number}; "
            "set data.num_prompts / data.max_operand"
        )
    rng = random.Random(f"relayrl-wordproblem/{seed}")
    return [_problem(rng, max_number, ops) for _ in range(n)]


def _problem(rng: random.Random, max_number: int, ops: tuple[int, ...]) -> dict[str, str]:
    name, item, value = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(min(2, max_number), max_number)
    sentences, steps = [f"{name} has {value} {item}."], []
    for _ in range(rng.choice(ops) if ops else rng.randint(MIN_STEPS, MAX_STEPS)):
        op, b = _step(rng, value, max_number)
        new = value + b if op == "+" else value - b if op == "-" else value * b if op == "*" else value // b
        sentences.append(_sentence(op, b, name, item))
        steps.append(f"{value} {op} {b} = {new}")
        value = new
    sentences += [f"How many {item} does {name} have now?", INSTRUCTION]
    return {"question": " ".join(sentences), "answer": str(value), "solution": "; ".join(steps)}


def _step(rng: random.Random, value: int, max_number: int) -> tuple[str, int]:
    """A random operator and operand among those that keep the quantity a whole number >= 1."""
    divisors = [k for k in (2, 3, 4) if value % k == 0]
    ops = ["+", "*"] + (["-"] if value >= 2 else []) + (["/"] if divisors else [])
    op = rng.choice(ops)
    if op == "+":
        return op, rng.randint(1, max_number)
    if op == "-":
        return op, rng.randint(1, min(max_number, value - 1))
    return op, rng.choice(tuple(TIMES) if op == "*" else divisors)


def _sentence(op: str, b: int, name: str, item: str) -> str:
    if op == "+":
        return f"{name} finds {b} more {item}."
    if op == "-":
        return f"{name} gives {b} {item} to a friend."
    if op == "*":
        return f"Then {name}'s {item} are {TIMES[b]}."
    return f"{name} splits the {item} into {b} equal groups and keeps one group."


def worked_answer(row: dict[str, str]) -> str:
    """The reply a supervised warm start teaches for ``row``: its steps in ``<think>``, the number in ``<answer>``."""
    return f"<think> {row['solution']} </think> <answer> {row['answer']} </answer>"
