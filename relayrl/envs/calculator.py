"""A calculator tool, evaluated safely, and the environment that offers it for the arithmetic task.

``calculate`` never calls ``eval``: it parses the expression with ``ast`` (``mode="eval"``) and walks
the tree itself, accepting only number literals, parentheses, ``+ - * / // % **`` and unary ``+ -``.
Names, calls, attributes, subscripts, comprehensions and strings are rejected, so an expression can
never reach a Python object. Limits keep a hostile expression cheap: at most ``MAX_CHARS`` characters
and every intermediate result within ``MAX_MAGNITUDE``; a power is checked *before* it is computed
(``|b**e| = 10**(e * log10|b|)``), so ``9**9**9`` is refused at once, not after minutes of big-integer work.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from collections.abc import Callable
from typing import Any

from relayrl.envs.toolenv import ToolEnv
from relayrl.envs.tools import ToolError

MAX_CHARS = 200
MAX_MAGNITUDE = 1e100

Number = int | float

_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalcError(ToolError):
    """The expression is not plain arithmetic, or it divides by zero, or it is too large."""


def calculate(expression: str) -> str:
    """Evaluate plain arithmetic and format the result: ``"3*7"`` -> ``"21"``, ``"1/4"`` -> ``"0.25"``.

    Integral results print without a decimal point (``"6/3"`` -> ``"2"``); others with 10 significant
    digits. Raises ``CalcError`` (one line, shown to the model) for anything else.
    """
    text = expression.strip()
    if not text:
        raise CalcError("empty expression; write e.g. 3*7")
    if len(text) > MAX_CHARS:
        raise CalcError(f"expression has {len(text)} characters; at most {MAX_CHARS}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalcError(f"cannot parse {text!r}; use numbers, ( ) and + - * / // % **") from None
    return _format(_eval(tree.body))


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # not bool, str, complex
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        return _checked(_apply(type(node.op), left, right))
    raise CalcError(f"{_describe(node)} is not allowed; use numbers, ( ) and + - * / // % **")


def _apply(op: type, left: Number, right: Number) -> Number:
    if op is ast.Pow and abs(left) not in (0, 1) and right * math.log10(abs(left)) > math.log10(MAX_MAGNITUDE):
        raise CalcError(f"result is larger than {MAX_MAGNITUDE:g}")
    try:
        return _BINARY[op](left, right)
    except ZeroDivisionError:
        raise CalcError("division by zero") from None
    except OverflowError:
        raise CalcError(f"result is larger than {MAX_MAGNITUDE:g}") from None


def _checked(value: Any) -> Number:
    if isinstance(value, complex):
        raise CalcError("result is not a real number (negative base with a fractional exponent)")
    if (isinstance(value, float) and not math.isfinite(value)) or abs(value) > MAX_MAGNITUDE:
        raise CalcError(f"result is larger than {MAX_MAGNITUDE:g}")
    return value


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return f"the literal {node.value!r}"
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return f"the operator {type(node.op).__name__}"
    return type(node).__name__


def _format(value: Number) -> str:
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.10g}"


FEEDBACK = "Call the calculator, or reply with your final answer as 'Answer: N'."
"""What the model reads after a turn with neither a tool call nor an answer (a user message)."""
INSTRUCTIONS = (
    "Use the calculator tool for any arithmetic: call it, read its result, then reply with the final answer "
    "as 'Answer: N'."
)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers, parentheses and + - * / // % **, e.g. 123*45
    """
    return calculate(expression)


class CalculatorEnv(ToolEnv):
    """Arithmetic with a calculator tool: needs the ``answer`` column (an integer), e.g. ``data.task=multiply``.

    * ``reset``: system prompt ``instructions`` plus the tool, user message the row's question.
    * a turn calling ``calculator``: its result comes back as a tool message; reward 0.
    * a turn with ``Answer:`` and no call ends the episode: reward 1.0 if the integer after the last ``Answer:``
      equals ``answer`` (``relayrl.rewards.builtin.parse_answer``, as the ``arith_correct`` reward), else 0.0.
    * any other turn: ``feedback`` as a user message, reward 0, the episode goes on (a model can recover from a
      malformed turn within ``env.max_turns``).
    """

    tools = (calculator,)

    def __init__(self, instructions: str = INSTRUCTIONS, feedback: str = FEEDBACK, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.system, self.feedback = instructions, feedback
        self.answer = 0

    def instructions(self, sample: dict[str, Any]) -> str:
        if "answer" not in sample:
            raise ValueError(
                f"CalculatorEnv needs an 'answer' column, the sample has {sorted(sample)}; "
                "use data.task=multiply (or arith) or a jsonl file with integer answers"
            )
        self.answer = int(str(sample["answer"]).strip().replace(",", ""))
        return self.system

    def finish(self, action: str) -> tuple[str, float, bool]:
        from relayrl.rewards.builtin import ANSWER_TAG, parse_answer

        if ANSWER_TAG not in action:
            return self._chat().reply(self.feedback), 0.0, False
        return "", float(parse_answer(action) == self.answer), True

    def demonstration(self, sample: dict[str, Any]) -> list[str]:
        """The model turns of a worked episode (a supervised warm start replays them through this env):
        one calculator call on the question's expression, then the answer."""
        expression = expression_of(sample["question"])
        call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        return [f"<tool_call>\n{call}\n</tool_call>", f"Answer: {calculate(expression)}"]


_EXPRESSION = re.compile(r"-?\d+(?:\s*[-+*/]\s*-?\d+)+")


def expression_of(question: str) -> str:
    """The first arithmetic expression in a question (``"What is 12 * 34?"`` -> ``"12 * 34"``)."""
    match = _EXPRESSION.search(question)
    if match is None:
        raise ValueError(f"no arithmetic expression in the question {question!r}; demonstrations need one")
    return match.group()
