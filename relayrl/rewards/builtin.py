"""Built-in reward functions, with TRL's signature ``fn(prompts, completions, **columns) -> list[float]``.

How an answer is read (``parse_answer``), chosen to reward the format the prompt asks for:

* Only the **last** ``Answer:`` counts (case-sensitive, exactly as the prompt spells it), so a model
  cannot list several candidates and be paid for any of them; the last one is its final word.
* After it, optional spaces and one integer (``-7``, ``1,200``), which must end there: followed by
  the end of the text, punctuation such as ``.`` or ``!``, or a word. ``Answer: 12.`` reads 12;
  ``Answer: 12.5`` and ``Answer: 1 2`` read nothing (not an integer / ambiguous).
* There is no fallback to "the last number in the text": a completion that never writes
  ``Answer:`` (e.g. ``answer: 12`` or just ``12``) scores 0. A fallback would pay for the right
  number in the wrong shape and leave ``answer_format`` nothing to teach.
"""

from __future__ import annotations

import re
from typing import Any

ANSWER_TAG = "Answer:"
_INTEGER = re.compile(
    r"[ \t]*(-?(?:\d{1,3}(?:,\d{3})+|\d+))"   # integer, optionally with thousands separators
    r"(?![\d,]|\.\d|[ \t]+\d)"                 # ... and nothing that would make it a different number
)


def parse_answer(completion: str) -> int | None:
    """The integer after the last ``Answer:`` in ``completion``, or None if it is missing or malformed."""
    tag = completion.rfind(ANSWER_TAG)
    if tag < 0:
        return None
    match = _INTEGER.match(completion, tag + len(ANSWER_TAG))
    return int(match.group(1).replace(",", "")) if match else None


def _as_int(answer: Any) -> int:
    try:
        return int(str(answer).strip().replace(",", ""))
    except ValueError:
        raise ValueError(f"arith_correct needs integer answers, got {answer!r}; "
                         "use exact_match or a custom reward for non-integer answers") from None


def arith_correct(prompts: list[str], completions: list[str], answer: list[Any], **_: Any) -> list[float]:
    """1.0 where ``parse_answer(completion) == int(answer)``, else 0.0."""
    return [float(parse_answer(c) == _as_int(a)) for c, a in zip(completions, answer, strict=True)]


def answer_format(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """1.0 where the completion ends its reasoning with a readable ``Answer: <int>``, whatever the value.

    A shaping reward: with a small weight it pays for the format before the model gets sums right.
    """
    return [float(parse_answer(c) is not None) for c in completions]


def exact_match(prompts: list[str], completions: list[str], answer: list[Any], **_: Any) -> list[float]:
    """1.0 where the completion, stripped of surrounding whitespace, equals ``str(answer)`` stripped."""
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)]


_LAST_INT = re.compile(r"-?\d+(?:,\d{3})*(?!.*\d)", re.DOTALL)


def last_number(completion: str) -> int | None:
    """The last integer written anywhere in ``completion`` (GSM8K-style extraction), or None."""
    match = _LAST_INT.search(completion)
    return int(match.group(0).replace(",", "")) if match else None


def last_number_correct(prompts: list[str], completions: list[str], answer: list[Any], **_: Any) -> list[float]:
    """1.0 where the last integer in the completion equals ``answer``.

    Lenient where ``arith_correct`` is strict: it grades the value, not the ``Answer:`` format, so a model
    that rarely follows the format (SmolLM2-135M writes ``Answer:`` in <1% of samples) still gets a signal.
    """
    return [float(last_number(c) == _as_int(a)) for c, a in zip(completions, answer, strict=True)]


def digit_fraction(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """Fraction of non-space characters that are digits: a dense signal even a random model varies on,
    used by the tiny test recipe to check that learning happens end to end."""
    chars = [[ch for ch in c if not ch.isspace()] for c in completions]
    return [sum(ch.isdigit() for ch in cs) / len(cs) if cs else 0.0 for cs in chars]
