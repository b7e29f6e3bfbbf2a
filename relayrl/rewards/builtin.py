"""Built-in reward functions, with TRL's signature ``fn(prompts, completions, **columns) -> list[float | None]``.

Arithmetic (``arith_correct``, ``answer_format``, ``last_number_correct``, ``digit_fraction``), ``exact_match``,
math answers (``math_verify``), format (``think_format``, ``regex_match``), ``length_penalty``, code
execution in a sandbox (``CodeExec``, registered as ``code_exec``) and a multi-turn episode's environment
reward (``env_reward``). Functions with settings take them as keyword arguments, which a recipe gives
as ``rewards: [{fn: regex_match, kwargs: {pattern: ...}}]``.

How an arithmetic answer is read (``parse_answer``), chosen to reward the format the prompt asks for:

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
    r"[ \t]*(-?(?:\d{1,3}(?:,\d{3})+|\d+))"  # integer, optionally with thousands separators
    r"(?![\d,]|\.\d|[ \t]+\d)"  # ... and nothing that would make it a different number
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
        raise ValueError(
            f"arith_correct needs integer answers, got {answer!r}; "
            "use exact_match or a custom reward for non-integer answers"
        ) from None


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


def env_reward(
    prompts: list[str], completions: list[str], env_reward: list[float | None] | None = None, **_: Any
) -> list[float | None]:
    """The episode reward its environment gave (multi-turn runs, ``env.name``): the ``env_reward`` column."""
    if env_reward is None:
        raise ValueError(
            "env_reward found no env_reward column: completions come from single-turn generation; "
            "set env.name=calculator (or another environment) in the recipe"
        )
    return [None if r is None else float(r) for r in env_reward]


# --------------------------------------------------------------------------- math, format, length, code
def _parse_gold(answer: Any) -> list:
    """math-verify's parse of a reference answer; GSM8K's ``... #### 72`` keeps the part after ``####``."""
    from math_verify import parse

    text = str(answer).split("####")[-1].strip()
    # Timeouts off: math-verify's use signal.alarm, which only works in a main thread; the reward pool's
    # per-call timeout (a killed worker process) bounds a pathological parse instead.
    return parse(text, parsing_timeout=None) or parse(f"${text}$", parsing_timeout=None)


def math_verify(prompts: list[str], completions: list[str], answer: list[Any], **_: Any) -> list[float | None]:
    """1.0 where math-verify finds the completion's answer equal to ``answer``, else 0.0 (GSM8K / MATH style).

    math-verify extracts the last LaTeX (``\\boxed{}`` first) or plain expression and compares values
    symbolically: ``\\frac{1}{2}``, ``1/2`` and ``0.5`` agree. None (does not apply) where the reference
    answer itself cannot be parsed, as TRL's ``accuracy_reward`` does, so bad rows don't pay 0 or 1.
    """
    from math_verify import parse, verify

    out: list[float | None] = []
    for completion, ref in zip(completions, answer, strict=True):
        gold = _parse_gold(ref)
        if not gold:
            out.append(None)
            continue
        pred = parse(completion, parsing_timeout=None)
        out.append(float(verify(gold, pred, timeout_seconds=None)))
    return out


_THINK = re.compile(r"\s*<think>(?:(?!<think>|</think>).)+</think>\s*\S.*", re.DOTALL)


def think_format(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """1.0 where the completion is one ``<think>...</think>`` block followed by a non-empty answer, else 0.0
    (the R1-style format reward; only whitespace may precede ``<think>``, and neither tag may repeat)."""
    return [float(_THINK.fullmatch(c) is not None and c.count("</think>") == 1) for c in completions]


def regex_match(prompts: list[str], completions: list[str], pattern: str, **_: Any) -> list[float]:
    """1.0 where ``re.fullmatch(pattern, completion, re.DOTALL)``, else 0.0; the pattern describes the whole
    completion (put ``.*`` at an end to allow more). Give it in the recipe: ``kwargs: {pattern: ...}``."""
    compiled = re.compile(pattern, re.DOTALL)
    return [float(compiled.fullmatch(c) is not None) for c in completions]


def length_penalty(
    prompts: list[str], completions: list[str], max_chars: int = 2000, buffer_chars: int = 500, **_: Any
) -> list[float]:
    """DAPO's soft overlong penalty, on characters (reward functions see text, not tokens)::

        0                          if L <= max_chars - buffer_chars
        (max_chars - buffer_chars - L) / buffer_chars   in between (0 down to -1, linearly)
        -1                         if L > max_chars

    Add it with a weight next to a correctness reward: long answers lose up to ``weight``.
    """
    if not 0 < buffer_chars <= max_chars:
        raise ValueError(f"length_penalty needs 0 < buffer_chars={buffer_chars} <= max_chars={max_chars}")
    soft = max_chars - buffer_chars
    return [
        0.0 if len(c) <= soft else -1.0 if len(c) > max_chars else (soft - len(c)) / buffer_chars for c in completions
    ]


_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str) -> str:
    """The last fenced code block (```python ... ```), or the whole completion when there is none."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


SANDBOX_ISOLATION = "reward/sandbox_isolation"
"""Metric: how ``code_exec`` isolates programs on the scorer's host (2 namespaces, 1 rlimits)."""
CREDITS = ("pass", "partial")


class CodeExec:
    """Score the completion's last code block against the row's tests, judged by ``rewards.harness``
    (the tests run in a trusted judge, the code in ``rewards.sandbox``); None where the row has no tests.

    Row columns (map a dataset's own names with ``data.columns``): ``tests`` (asserts, or HumanEval's
    ``check`` with ``entry_point``), ``test_setup`` (trusted code run before the tests: HumanEval's
    prompt, MBPP's ``test_setup_code``), ``stdio`` (input/output cases), ``code_prefix`` (prepended to the
    code: HumanEval's prompt, for completions that write only the function's body).

    ``credit``: ``pass`` scores 1.0 when every case held, else 0.0; ``partial`` scores the fraction of
    cases that held (``reward/pass_rate`` still counts only full passes). ``sandbox``: auto (full
    isolation, or an error here, at load) | rlimits. ``max_parallel`` programs at a time; keep
    ``timeout_s * len(completions) / max_parallel`` under ``reward.timeout_s``.
    """

    def __init__(
        self,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_parallel: int = 2,
        sandbox: str = "auto",
        credit: str = "pass",
    ) -> None:
        from relayrl.rewards.sandbox import resolve_isolation

        if credit not in CREDITS:
            raise ValueError(f"code_exec credit={credit!r} is not one of {', '.join(CREDITS)}")
        self.timeout_s, self.memory_mb, self.max_parallel, self.sandbox = timeout_s, memory_mb, max_parallel, sandbox
        self.credit = credit
        self.level = resolve_isolation(sandbox)  # fails closed now, before any worker starts
        self.__name__ = "code_exec"

    def __call__(
        self,
        prompts: list[str],
        completions: list[str],
        tests: list | None = None,
        entry_point: list | None = None,
        test_setup: list | None = None,
        stdio: list | None = None,
        code_prefix: list | None = None,
        **_: Any,
    ) -> list[float | None]:
        from concurrent.futures import ThreadPoolExecutor

        n = len(completions)
        rows = zip(
            completions, *((column or [None] * n) for column in (tests, entry_point, test_setup, stdio, code_prefix))
        )
        with ThreadPoolExecutor(max_workers=self.max_parallel) as pool:
            return list(pool.map(lambda row: self.score(*row), rows))

    def score(
        self,
        completion: str,
        tests: Any = None,
        entry_point: str | None = None,
        test_setup: str | None = None,
        stdio: Any = None,
        code_prefix: str | None = None,
    ) -> float | None:
        """One completion against its row's tests (None: no tests); ValueError for tests that cannot prove
        a pass (raised before any program runs)."""
        from relayrl.rewards.harness import judge, plan_tests

        if not tests and stdio is None:
            return None
        spec = plan_tests(tests, entry_point, test_setup, stdio)
        code = (code_prefix or "") + extract_code(completion)
        verdict = judge(spec, code, timeout_s=self.timeout_s, memory_mb=self.memory_mb, isolation=self.sandbox)
        return verdict.credit if self.credit == "partial" else float(verdict.ok)

    def metrics(self) -> dict[str, float]:
        """Added to the step's metrics by the scorer: the isolation level programs run under."""
        return {SANDBOX_ISOLATION: float(self.level)}
