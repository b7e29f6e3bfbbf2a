"""The calculator tool (safe arithmetic), tool-call parsing, the calculator environment and the registry."""

from __future__ import annotations

import ast
import math
import operator
from typing import ClassVar

import pytest

from relayrl.envs import (
    ENVIRONMENTS,
    CalcError,
    CalculatorEnv,
    Environment,
    ToolCall,
    ToolEnv,
    calculate,
    calculator,
    env_factory,
    load_env_class,
    parse_tool_call,
)
from relayrl.envs.calculator import FEEDBACK, HINT, MAX_MAGNITUDE
from relayrl.envs.tools import Tool

QUESTION = "What is 3 + 4? Reply with 'Answer: N'."
PROMPT = f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("3*7", "21"),
        (" 12 + 7 ", "19"),
        ("2**10", "1024"),
        ("-(3 - 10)", "7"),
        ("7 // 2", "3"),
        ("7 % 4", "3"),
        ("1/4", "0.25"),
        ("6/3", "2"),
        ("1/3", "0.3333333333"),
        ("2.5*2", "5"),
        ("+4", "4"),
        ("(1+2)*(3+4)", "21"),
        ("2**-2", "0.25"),
        ("1_000 + 1", "1001"),
        ("1**1000", "1"),
        ("10**100", str(10**100)),
    ],
)
def test_calculate(expr, expected):
    assert calculate(expr) == expected


@pytest.mark.parametrize(
    "expr, match",
    [
        ("__import__('os').system('echo hi')", "Call is not allowed"),
        ("open('/etc/passwd')", "Call is not allowed"),
        ("x + 1", "Name is not allowed"),
        ("(1).__class__", "Attribute is not allowed"),
        ("[1, 2][0]", "Subscript is not allowed"),
        ("'a' * 3", "the literal 'a' is not allowed"),
        ("True + 1", "the literal True is not allowed"),
        ("1j * 2", "the literal 1j is not allowed"),
        ("3 ^ 2", "the operator BitXor is not allowed"),
        ("1 < 2", "Compare is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("1/0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("9**9**9", "larger than 1e\\+100"),
        ("0.5**-400", "larger than 1e\\+100"),
        ("10**101", "larger than 1e\\+100"),
        ("1e308 * 10", "larger than 1e\\+100"),
        ("(-8) ** 0.5", "not a real number"),
        ("3 *", "cannot parse"),
        ("import os", "cannot parse"),
        ("", "empty expression"),
        ("1+" * 150 + "1", "at most 200"),
    ],
)
def test_calculate_refuses_anything_but_bounded_arithmetic(expr, match):
    with pytest.raises(CalcError, match=match):
        calculate(expr)


def test_hostile_powers_are_refused_before_they_are_computed(monkeypatch):
    """Cheap by construction: every power actually computed has a result within MAX_MAGNITUDE, so none of
    these costs big-integer work (``9**9**9`` alone would take minutes if it reached ``operator.pow``)."""
    computed = []

    def recording_pow(base, exp):
        computed.append((base, exp))
        return operator.pow(base, exp)

    monkeypatch.setitem(calculator._BINARY, ast.Pow, recording_pow)
    for expr in ("9**9**9**9", "(10**64)**64**64", "2**200*2**200", "99999999**64"):
        with pytest.raises(CalcError):
            calculate(expr)
    assert computed, "the recording pow was not used: the test no longer watches the evaluator"
    assert all(abs(b) in (0, 1) or e * math.log10(abs(b)) <= math.log10(MAX_MAGNITUDE) for b, e in computed)


@pytest.mark.parametrize(
    "text, call",
    [
        ("let me compute <calc>3*7</calc>", ToolCall("calc", "3*7")),
        ("<tool>calc: 3 * 7 </tool>", ToolCall("calc", "3 * 7")),
        ("<tool> search:  who\nwon </tool>", ToolCall("search", "who\nwon")),  # generic spelling: any name
        ("<calc>1+1</calc> then <tool>calc: 2+2</tool>", ToolCall("calc", "1+1")),  # the first call counts
        ("<tool>calc: 2+2</tool> then <calc>1+1</calc>", ToolCall("calc", "2+2")),
        ("<calc>3*7", None),  # not closed
        ("<b>3*7</b>", None),  # not a known tool's tag
        ("Answer: 21", None),
    ],
)
def test_parse_tool_call(text, call):
    assert parse_tool_call(text, ("calc",)) == call


def _env(answer="7") -> CalculatorEnv:
    env = CalculatorEnv()
    env.reset({"prompt": PROMPT, "question": QUESTION, "answer": answer})
    return env


def test_reset_puts_the_hint_inside_the_user_turn():
    obs = CalculatorEnv().reset({"prompt": PROMPT, "question": QUESTION, "answer": "7"})
    assert obs == f"<|im_start|>user\n{QUESTION} {HINT}<|im_end|>\n<|im_start|>assistant\n"
    assert CalculatorEnv(hint="").reset({"prompt": PROMPT, "question": QUESTION, "answer": "7"}) == PROMPT
    assert CalculatorEnv().reset({"prompt": "raw", "answer": "7"}) == f"{HINT}\nraw"  # question not found
    with pytest.raises(ValueError, match="needs an 'answer' column"):
        CalculatorEnv().reset({"prompt": PROMPT})


def test_episode_steps_tool_then_answer():
    env = _env()
    assert env.stop == ["</tool>", "</calc>"]
    assert env.step("I will add. <calc>3+4</calc>") == ("<result>7</result>\n", 0.0, False)
    assert env.step("<tool>calc: 3/0</tool>") == ("<result>error: division by zero</result>\n", 0.0, False)
    assert env.step("<tool>web: 3</tool>") == (
        "<result>error: unknown tool 'web'; available: calc</result>\n",
        0.0,
        False,
    )
    assert env.step("so it is 7") == (FEEDBACK, 0.0, False)  # neither call nor answer: re-prompt
    assert env.step("The result is 7. Answer: 7") == ("", 1.0, True)


@pytest.mark.parametrize(
    "action, reward",
    [
        ("Answer: 8", 0.0),
        ("Answer: 7.", 1.0),
        ("Answer: 3 Answer: 7", 1.0),
        ("Answer: 7 Answer: 3", 0.0),
        ("Answer: seven", 0.0),
    ],
)
def test_final_answer_reward(action, reward):
    obs, r, done = _env().step(action)
    assert (obs, r, done) == ("", reward, True)


def test_answer_column_may_be_text_with_separators():
    assert _env(answer=" 1,200 ").step("Answer: 1200") == ("", 1.0, True)


def test_tool_errors_from_user_tools_become_messages():
    def boom(args: str) -> str:  # a user tool's bug
        raise KeyError(args)

    class Boom(ToolEnv):
        tools: ClassVar[dict[str, Tool]] = {"boom": boom}

    assert Boom().step("<boom>key</boom>") == ("<result>error: KeyError: 'key'</result>\n", 0.0, False)
    with pytest.raises(NotImplementedError, match="must implement finish"):
        Boom().step("no call")


class Countdown:
    """A plain environment class (no base class): done after ``turns`` steps, reward 1 on the last."""

    def __init__(self, turns: int = 2):
        self.turns = turns

    def reset(self, sample):
        return sample["prompt"]

    def step(self, action):
        self.turns -= 1
        return f"[{self.turns} left]", float(self.turns == 0), self.turns == 0


def _not_an_env():
    return {"reset": None}


def test_registry_and_import_paths():
    assert ENVIRONMENTS["calculator"] is CalculatorEnv
    assert load_env_class("calculator") is CalculatorEnv
    assert load_env_class("tests.envs.test_calculator:Countdown") is Countdown
    make = env_factory("tests.envs.test_calculator:Countdown", {"turns": 3})
    a, b = make(), make()
    assert a is not b and isinstance(a, Environment)  # a fresh instance per episode
    assert isinstance(a, Countdown) and a.turns == 3


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("nope", None, "neither a built-in \\(calculator\\) nor an import path"),
        ("no_such_module_xyz:Env", None, "cannot import module 'no_such_module_xyz'"),
        ("tests.envs.test_calculator:Missing", None, "has no class 'Missing'"),
        ("calculator", {"bogus": 1}, "rejects kwargs=\\{'bogus': 1\\}"),
        ("tests.envs.test_calculator:QUESTION", None, "names str, not a class"),
        ("tests.envs.test_calculator:_not_an_env", None, "lacks reset\\(sample\\) or step\\(action\\)"),
    ],
)
def test_bad_environment_names(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        env_factory(name, kwargs)
