"""Completions that try to score on ``code_exec`` without solving the task: each must score 0, while an
honest solution scores 1 (so the test fails if the harness is broken in either direction)."""

from __future__ import annotations

import pytest

from relayrl.rewards.builtin import CodeExec
from relayrl.rewards.harness import plan_tests, verify
from relayrl.rewards.sandbox import namespaces_available

TESTS = "import math\nassert f(2) == 4\nassert f(5) == 10 and f(-1) == -2\nassert math.isclose(f(0.25), 0.5)"
HONEST = "def f(x):\n    return 2 * x\n"
STUB = "def f(x):\n    return 0\n"

HOSTILE = {
    "sys_exit_first": "import sys\nsys.exit(0)\n" + HONEST,
    "os_exit_first": "import os\nos._exit(0)\n",
    "exit_in_del": STUB + "class D:\n    def __del__(self):\n        raise SystemExit(0)\nd = D()\n",
    "always_equal": "class A:\n    def __eq__(self, o): return True\n    __ne__ = lambda s, o: False\n"
                    "    __float__ = lambda s: 0.5\ndef f(x):\n    return A()\n",
    "int_subclass_equal": "class I(int):\n    def __eq__(self, o): return True\ndef f(x):\n    return I(0)\n",
    "patched_builtins": "import builtins\nbuiltins.repr = lambda v: '4'\nbuiltins.isinstance = lambda *a: True\n"
                        + STUB,
    "prints_markers": STUB + "print('ok'); print('PASS'); print('all tests passed')\n",
    "forges_the_channel": "import os\nos.write(3, b'ok\\n' + b'ok True\\n' * 4)\nos._exit(0)\n",
    "guesses_on_the_channel": "import os\nfor v in range(-3, 11):\n    os.write(3, f'ok {v}\\n'.encode())\n"
                              + STUB,
    "atexit_forgery": "import atexit, os\natexit.register(lambda: os.write(3, b'ok\\nok 4\\nok 10\\n'))\n" + STUB,
    "replaces_os_write": "import os\n_w = os.write\nos.write = lambda fd, b: _w(fd, b'ok\\n' * 5)\n" + STUB,
    "empties_the_plan": "import json\njson.loads = lambda s: []\n" + STUB,
    "kills_its_group": STUB + "import os, signal\nos.kill(0, signal.SIGKILL)\n",
    "forks_and_exits": "import os\nif os.fork():\n    os._exit(0)\n" + STUB,
    "reads_the_tests": "import os\nsrc = open('plan.json').read()\n"
                       "def f(x):\n    return 4 if '4' in src else 0\n",
    "nan_everywhere": "def f(x):\n    return float('nan')\n",
    "hangs": "while True:\n    pass\n",
    "raises": "def f(x):\n    raise AssertionError('no')\n",
}
ISOLATION = ["rlimits", pytest.param("required", marks=pytest.mark.skipif(
    not namespaces_available(), reason="no root / unshare(2): level 2 unavailable here"))]


@pytest.mark.parametrize("isolation", ISOLATION)
def test_hostile_completions_score_zero_and_the_honest_one_one(isolation):
    names = list(HOSTILE)
    reward = CodeExec(timeout_s=15.0, max_parallel=2, sandbox=isolation)   # honest code never times out
    completions = [f"```python\n{HOSTILE[n]}```" for n in names] + [f"```python\n{HONEST}```"]
    scores = reward([""] * len(completions), completions, tests=[TESTS] * len(completions))
    assert dict(zip(names + ["honest"], scores)) == {**{n: 0.0 for n in names}, "honest": 1.0}


def test_the_program_never_sees_an_expected_value():
    plan = plan_tests(TESTS)
    assert plan.steps == (("exec", "import math"), ("eval", "f(2)"), ("eval", "f(5)"), ("eval", "f(-1)"),
                          ("eval", "f(0.25)"))
    assert plan.checks == ("_v[1] == 4", "_v[2] == 10", "_v[3] == -2", "math.isclose(_v[4], 0.5)")


@pytest.mark.parametrize("channel, passed", [
    (b"ok\nok 4\nok 10\nok -2\nok 0.5\n", True),
    (b"ok\nok 4\nok 10\nok -2\n", False),                        # a step missing: early exit
    (b"ok\nok 4\nok 10\nok -2\nok 0.5\nok 4\n", False),          # an extra line
    (b"ok\nok 4\nok 10\nerr\nok 0.5\n", False),                  # a step raised
    (b"ok\nok 4\nok 10\nok -2\nok A()\n", False),                # not a literal
    (b"ok\nok 4\nok 10\nok -2\nok 0.5", False),                  # torn last line
    (b"ok\nok True\nok 10\nok -2\nok 0.5\n", False),             # True != 4
])
def test_verify_needs_one_wellformed_value_per_step(channel, passed):
    assert verify(plan_tests(TESTS), channel) is passed


@pytest.mark.parametrize("tests, message", [
    ("def check(c):\n    assert c(1) == 2\ncheck(f)", "need each assert at the top level"),
    ("for x in range(3):\n    assert f(x) == 2 * x", "need each assert at the top level"),
    ("f(1)", "have no top-level assert"),
    ("assert all(f(x) == 2 * x for x in range(3))", "program would compute its truth itself"),
    ("assert f(2) == 4 and is_even(f(2))", "program would compute its truth itself"),
    ("assert all([f(x) == 2 * x for x in range(3)])", "program would compute its truth itself"),
])
def test_tests_that_cannot_be_proved_are_refused(tests, message):
    with pytest.raises(ValueError, match=message):
        plan_tests(tests)


def test_a_comprehension_inside_a_comparison_is_reported_and_compared_here():
    plan = plan_tests("assert [f(x) for x in range(3)] == [0, 2, 4]")
    assert plan.steps == (("eval", "[f(x) for x in range(3)]"),) and plan.checks == ("_v[0] == [0, 2, 4]",)
    assert verify(plan, b"ok [0, 2, 4]\n") and not verify(plan, b"ok True\n")
