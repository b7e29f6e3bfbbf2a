"""The calculator tool (safe arithmetic), tool-call parsing, the calculator environment and the registry."""

from __future__ import annotations

import ast
import asyncio
import json
import math
import operator

import pytest

import relayrl.envs.calculator as calc_module
from relayrl.envs import (
    ENVIRONMENTS,
    CalcError,
    CalculatorEnv,
    Environment,
    ToolEnv,
    calculate,
    env_factory,
    load_env_class,
)
from relayrl.envs.calculator import FEEDBACK, MAX_MAGNITUDE

QUESTION = "What is 3 + 4? Reply with 'Answer: N'."


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

    monkeypatch.setitem(calc_module._BINARY, ast.Pow, recording_pow)
    for expr in ("9**9**9**9", "(10**64)**64**64", "2**200*2**200", "99999999**64"):
        with pytest.raises(CalcError):
            calculate(expr)
    assert computed, "the recording pow was not used: the test no longer watches the evaluator"
    assert all(abs(b) in (0, 1) or e * math.log10(abs(b)) <= math.log10(MAX_MAGNITUDE) for b, e in computed)


@pytest.fixture(scope="module")
def tok():
    from relayrl.models.tiny import build_tokenizer

    return build_tokenizer()


def _env(tok, answer="7") -> CalculatorEnv:
    env = CalculatorEnv()
    env.setup(tok)
    env.reset({"prompt": "", "question": QUESTION, "answer": answer})
    return env


def _result(tok, text: str) -> str:
    """What the calculator environment answers to a calling turn: the default format's tool message."""
    return f"<|im_end|>\n<|im_start|>tool\n<tool_response>\n{text}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def _call(expression) -> str:
    return (
        f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": {json.dumps(expression)}}}}}\n</tool_call>'
    )


def test_reset_renders_instructions_tool_and_question(tok):
    env = CalculatorEnv(instructions="Be exact.")
    env.setup(tok)
    prompt = env.reset({"prompt": "", "question": QUESTION, "answer": "7"})
    assert prompt.startswith("<|im_start|>system\nBe exact.\n\nYou may call one or more functions")
    assert prompt.count('"name": "calculator"') == 1 and "Evaluate an arithmetic expression exactly." in prompt
    assert prompt.endswith(f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    assert env.stop == ["</tool_call>"]
    with pytest.raises(ValueError, match="needs an 'answer' column"):
        env.reset({"prompt": "", "question": QUESTION})
    with pytest.raises(RuntimeError, match="setup\\(tokenizer\\) must run"):
        CalculatorEnv().reset({"prompt": "", "question": QUESTION, "answer": "7"})


def test_episode_steps_tool_then_answer(tok):
    env = _env(tok)
    assert asyncio.run(env.step(f"I will add. {_call('3+4')}")) == (_result(tok, "7"), 0.0, False)
    assert asyncio.run(env.step(_call("3/0"))) == (_result(tok, "error: division by zero"), 0.0, False)
    web = '<tool_call>{"name": "web", "arguments": {"q": 3}}</tool_call>'
    assert asyncio.run(env.step(web)) == (
        _result(tok, "error: unknown tool 'web'; available: calculator"),
        0.0,
        False,
    )
    assert env.metrics() == {"tool_calls": 2.0, "tool_errors": 2.0}
    feedback = f"<|im_end|>\n<|im_start|>user\n{FEEDBACK}<|im_end|>\n<|im_start|>assistant\n"
    assert asyncio.run(env.step("so it is 7")) == (feedback, 0.0, False)  # neither call nor answer: re-prompt
    assert asyncio.run(env.step("The result is 7. Answer: 7")) == ("", 1.0, True)


def test_demonstration_replays_to_the_right_answer(tok):
    env = _env(tok, answer=str(123 * 45))
    call, answer = env.demonstration({"question": "What is 123 * 45? Reply with 'Answer: N'."})
    assert asyncio.run(env.step(call)) == (_result(tok, "5535"), 0.0, False)
    assert answer == "Answer: 5535" and asyncio.run(env.step(answer)) == ("", 1.0, True)


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
def test_final_answer_reward(tok, action, reward):
    assert asyncio.run(_env(tok).step(action)) == ("", reward, True)


def test_answer_column_may_be_text_with_separators(tok):
    assert asyncio.run(_env(tok, answer=" 1,200 ").step("Answer: 1200")) == ("", 1.0, True)


class Countdown:
    """A plain environment class (no base class): done after ``turns`` steps, reward 1 on the last."""

    def __init__(self, turns: int = 2):
        self.turns = turns

    def reset(self, sample):
        return sample["prompt"]

    def step(self, action):
        self.turns -= 1
        return f"[{self.turns} left]", float(self.turns == 0), self.turns == 0


def untyped(x):
    """A tool without type hints."""
    return x


class Untyped(ToolEnv):
    tools = (untyped,)


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
        ("nope", None, "neither a built-in \\(calculator, python"),
        ("no_such_module_xyz:Env", None, "cannot import module 'no_such_module_xyz'"),
        ("tests.envs.test_calculator:Missing", None, "has no class 'Missing'"),
        ("calculator", {"bogus": 1}, "rejects kwargs=\\{'bogus': 1\\}"),
        ("calculator", {"tool_timeout_s": 0}, "tool_timeout_s=0 must be > 0"),
        ("tests.envs.test_calculator:Untyped", None, "cannot derive its schema"),
        ("tests.envs.test_calculator:QUESTION", None, "names str, not a class"),
        ("tests.envs.test_calculator:_not_an_env", None, "lacks reset\\(sample\\) or step\\(action\\)"),
    ],
)
def test_bad_environment_names(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        env_factory(name, kwargs)
