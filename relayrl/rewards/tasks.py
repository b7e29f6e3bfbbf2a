"""Rewards of the generated tasks with a format of their own (``data.task=countdown`` / ``wordproblem`` /
``count``), TRL's signature.

Completions come from an optimiser that profits from fooling these checks, so each reads strictly:

* ``answer_block``: the content of the completion's **only** ``<answer>...</answer>``. Two answer
  blocks, a lone or repeated tag, or a ``<think>`` tag inside give None: a model cannot list several
  candidates, or hide one inside another, and be paid for any of them.
* ``think_answer_format``: 1.0 only for ``<think>T</think> <answer>A</answer>``, whitespace around,
  ``T`` and ``A`` not blank and each of the four tags written exactly once (no nesting, no repeats).
* ``answer_tag_correct``: 1.0 where the answer block is one integer equal to ``answer``.
* ``countdown_correct``: 1.0 where the answer block is an expression over ``nums`` that equals
  ``target`` exactly. It is parsed with ``ast``, never evaluated as code: only ASCII digits, spaces,
  ``+ - * /`` and parentheses may appear; only integer literals and binary + - * / nodes are accepted
  (no unary minus, ``**``, ``//``, names or calls); the literals must be ``nums`` exactly (TinyZero's
  rule: each given number used exactly once, all of them); the value is computed in ``Fraction``\\ s, so
  ``7 / 3 * 3`` is exactly 7 and a division by zero scores 0.
* ``count_correct``: the integers the completion writes (ASCII ``-?[0-9]+``, in order, whatever is between
  them) must read ``1, 2, ..., N``. Score: the longest run from 1 it starts with, ``k``, over
  ``max(N, how many integers it wrote)``. Compared as strings, never converted: ``01``, ``-1`` or a skipped
  or repeated number ends the run, and every number past N lowers the score, so only exactly ``1..N``
  earns 1.0 and padding or listing candidates earns less.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from relayrl.rewards.builtin import _as_int

TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_FORMAT = re.compile(r"\s*<think>(.*)</think>\s*<answer>(.*)</answer>\s*", re.DOTALL)
_INTEGER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)", re.ASCII)
_SIGNED_DIGITS = re.compile(r"-?[0-9]+")
_EXPRESSION_CHARS = re.compile(r"[0-9+\-*/() \t]+")
MAX_EXPRESSION_CHARS = 200
"""Longer answer blocks score 0 unparsed (a Countdown answer over 4 numbers needs ~20 characters)."""
_OPS = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__, ast.Div: Fraction.__truediv__}


def answer_block(completion: str) -> str | None:
    """The stripped content of the only ``<answer>...</answer>`` in ``completion``, else None."""
    if completion.count("<answer>") != 1 or completion.count("</answer>") != 1:
        return None
    start, end = completion.index("<answer>") + len("<answer>"), completion.index("</answer>")
    content = completion[start:end] if start <= end else None
    if content is None or "<think>" in content or "</think>" in content:
        return None
    return content.strip()


def think_answer_format(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """1.0 where the completion is exactly one non-blank ``<think>`` block then one non-blank
    ``<answer>`` block (whitespace around them only), else 0.0."""
    return [float(_well_formed(c)) for c in completions]


def _well_formed(completion: str) -> bool:
    match = _FORMAT.fullmatch(completion)
    return (
        match is not None
        and all(completion.count(tag) == 1 for tag in TAGS)
        and bool(match.group(1).strip())
        and bool(match.group(2).strip())
    )


def answer_tag_correct(prompts: list[str], completions: list[str], answer: list[Any], **_: Any) -> list[float]:
    """1.0 where the answer block is one integer (``1,200`` allowed) equal to ``answer``, else 0.0."""
    return [float(_tagged_int(c) == _as_int(a)) for c, a in zip(completions, answer, strict=True)]


def _tagged_int(completion: str) -> int | None:
    block = answer_block(completion)
    if block is None or not _INTEGER.fullmatch(block):
        return None
    return int(block.replace(",", ""))


def countdown_correct(
    prompts: list[str], completions: list[str], nums: list[list[int]], target: list[Any], **_: Any
) -> list[float]:
    """1.0 where the answer block is an expression using each of ``nums`` once whose exact value is
    ``target``, else 0.0 (rules: module docstring)."""
    out = []
    for completion, numbers, goal in zip(completions, nums, target, strict=True):
        value = countdown_value(answer_block(completion), numbers)
        out.append(float(value is not None and value == _as_int(goal)))
    return out


def countdown_value(expression: str | None, nums: list[int]) -> Fraction | None:
    """The exact value of ``expression`` if it is a valid Countdown answer over ``nums``, else None."""
    if expression is None or len(expression) > MAX_EXPRESSION_CHARS or not _EXPRESSION_CHARS.fullmatch(expression):
        return None
    try:
        tree = ast.parse(expression, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    literals: list[int] = []
    if not _arithmetic_only(tree, literals) or Counter(literals) != Counter(int(n) for n in nums):
        return None
    try:
        return _evaluate(tree)
    except ZeroDivisionError:
        return None


def _arithmetic_only(node: ast.AST, literals: list[int]) -> bool:
    """True when ``node`` holds only int literals (collected into ``literals``) and binary + - * /."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        literals.append(node.value)
        return True
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _arithmetic_only(node.left, literals) and _arithmetic_only(node.right, literals)
    return False


def _evaluate(node: ast.AST) -> Fraction:
    """Value of a tree ``_arithmetic_only`` accepted, in exact fractions."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return Fraction(node.value)
    assert isinstance(node, ast.BinOp), "only what _arithmetic_only accepted"
    return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))


def count_correct(prompts: list[str], completions: list[str], answer: list[Any], **_: Any) -> list[float]:
    """How much of ``1, 2, ..., answer`` each completion counts out, in [0, 1] (``count_score``)."""
    return [count_score(c, _as_int(a)) for c, a in zip(completions, answer, strict=True)]


def count_score(completion: str, n: int) -> float:
    """``k / max(n, m)``: ``k`` the longest run ``1, 2, ..., k`` (k <= n) the ``m`` integers in ``completion``
    start with (rules: module docstring)."""
    written = _SIGNED_DIGITS.findall(completion)
    run = 0
    while run < min(n, len(written)) and written[run] == str(run + 1):
        run += 1
    return run / max(n, len(written), 1)
