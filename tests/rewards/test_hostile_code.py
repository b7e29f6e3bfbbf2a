"""Completions that try to score on ``code_exec`` without solving the task.

Every hostile completion must score 0 and the honest one 1, at each isolation level the product
accepts, for every test form the docs accept (``asserts``, ``check``, ``stdio``). The tests use
computed expected values, variables, helper calls, ``or``/``not``, comprehensions and exceptions: the
shapes that a program reporting its own verdict (or both sides of a check) could forge.
"""

from __future__ import annotations

import os

import pytest

from relayrl.rewards.builtin import CodeExec
from relayrl.rewards.sandbox import _can_drop

ASSERTS = """\
import math
expected = 8

def twice(v):
    return 2 * v

assert f(3) == 2 ** 3
assert f(3) == expected
assert f(3) == max([expected, 1]) * 1
assert f(0) == 1 or f(0) == -1
assert not f(1) == 3
assert all(f(x) == 2 ** x for x in range(5))
assert [f(x) for x in (1, 2)] == [twice(1), twice(2)]
assert math.isclose(f(0.5), 2 ** 0.5)
try:
    f("x")
    raised = False
except TypeError:
    raised = True
assert raised
"""
ASSERTS_HONEST = "def f(x):\n    return 2 ** x\n"

CHECK_PRELUDE = 'def g(xs):\n    """Sorted copy, without duplicates."""\n'
CHECK = """\
def check(candidate):
    import random
    rng = random.Random(0)
    for _ in range(20):
        xs = [rng.randint(-9, 9) for _ in range(rng.randint(0, 8))]
        assert candidate(list(xs)) == sorted(set(xs))
    assert candidate([]) == []
"""
CHECK_HONEST = "def g(xs):\n    return sorted(set(xs))\n"

STDIO = [["3 4\n", "7\n"], ["10 -2\n", "8"], ["0 0\n", "0\n"], ["123456789 1\n", "123456790\n"]]
STDIO_HONEST = "a, b = map(int, input().split())\nprint(a + b)\n"

# Hostile programs that apply to every form (they do not depend on the tested function's name).
COMMON = {
    "sys_exit_first": "import sys\nsys.exit(0)\n",
    "os_exit_first": "import os\nos._exit(0)\n",
    "exit_in_del": "class D:\n    def __del__(self):\n        raise SystemExit(0)\nd = D()\n",
    "prints_markers": "print('ok'); print('PASS'); print('all tests passed')\n",
    "floods_the_reply_pipe": "import os\nos.write(4, b'ok [\"bool\",true]\\n' * 500)\n",
    "forges_a_verdict_line": "import os\nfor fd in range(3, 64):\n    try:\n"
    '        os.write(fd, b\'{"passed": 9, "total": 9, "complete": true}\\n\')\n'
    "    except OSError:\n        pass\n",
    "reads_the_judge_fds": "import os\nfor pid in os.listdir('/proc'):\n    try:\n"
    "        for fd in os.listdir(f'/proc/{pid}/fd'):\n"
    "            os.open(f'/proc/{pid}/fd/{fd}', os.O_WRONLY | os.O_NONBLOCK)\n"
    "    except (OSError, ValueError):\n        pass\n",
    "kills_its_group": "import os, signal\nos.kill(0, signal.SIGKILL)\n",
    "kills_every_process": "import os, signal\nfor pid in range(2, 4096):\n    try:\n"
    "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n",
    "hangs": "while True:\n    pass\n",
    "sleeps": "import time\ntime.sleep(60)\n",
    "memory_bomb": "x = bytearray(1 << 33)\n",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "deep_recursion": "import sys\nsys.setrecursionlimit(10**6)\ndef r(n):\n    return r(n + 1)\nr(0)\n",
    "patched_builtins": "import builtins\nbuiltins.print = lambda *a, **k: None\nbuiltins.input = lambda *a: '0'\n",
}

# Hostile definitions of the tested function, written for each form's name.
FUNCTION_HOSTILE = {
    "constant_expected": "def {name}(*a):\n    return 8\n",
    "always_equal": "class A:\n    def __eq__(self, o): return True\n    __ne__ = lambda s, o: False\n"
    "    __bool__ = lambda s: True\n    __hash__ = lambda s: 0\ndef {name}(*a):\n    return A()\n",
    "int_subclass": "class I(int):\n    def __eq__(self, o): return True\ndef {name}(*a):\n    return I(0)\n",
    "float_subclass": "class F(float):\n    def __eq__(self, o): return True\ndef {name}(*a):\n    return F(8)\n",
    "tuple_of_magic": "class A:\n    __eq__ = lambda s, o: True\ndef {name}(*a):\n    return (A(),)\n",
    "list_subclass": "class L(list):\n    def __eq__(self, o): return True\ndef {name}(*a):\n    return L()\n",
    "returns_true": "def {name}(*a):\n    return True\n",
    "returns_nan": "def {name}(*a):\n    return float('nan')\n",
    "returns_a_generator_of_trues": "def {name}(*a):\n    return (True for _ in range(3))\n",
    "raises_assertion": "def {name}(*a):\n    raise AssertionError('no')\n",
    "raises_type_error": "def {name}(*a):\n    raise TypeError('always')\n",
    "exits_when_called": "import os\ndef {name}(*a):\n    os._exit(0)\n",
    "replies_then_exits": "import os\ndef {name}(*a):\n    os.write(4, b'ok [\"bool\",true]\\n')\n    os._exit(0)\n",
    "patches_its_own_codec": "dumps = lambda v: '[\"bool\",true]'\ndef {name}(*a):\n    return 0\n",
    "returns_a_huge_string": "def {name}(*a):\n    return 'x' * (1 << 22)\n",
    "stateful_guess": "n = [0]\ndef {name}(*a):\n    n[0] += 1\n    return n[0]\n",
}

STDIO_HOSTILE = {
    "prints_every_expected_answer": "print(7)\nprint(8)\nprint(0)\nprint(123456790)\n",
    "prints_to_the_real_stdout": "import os, sys\nos.write(1, b'7\\n')\nsys.__stdout__.write('7\\n')\n",
    "prints_one_constant": "print(7)\n",
    "exits_without_printing": "import sys\nsys.exit(0)\n",
}

ISOLATION = [
    "rlimits",
    pytest.param("auto", marks=pytest.mark.skipif(os.geteuid() != 0, reason="full isolation needs root")),
]
"""Where CI runs as root, full isolation runs: ``CodeExec(sandbox='auto')`` raises on a root host without it."""


def _fence(code: str) -> str:
    return f"```python\n{code}```"


UNCAPPED = {"fork_bomb", "kills_every_process"}
"""Cases run only where the sandbox has its own uid: at ``rlimits`` as the trainer's user (docs/rewards.md)
there is no process cap, and a program may signal whatever that user can, so these would hit the host."""


def _score(isolation: str, completions: dict[str, str], **columns) -> dict[str, float | None]:
    if isolation == "rlimits" and not _can_drop():
        completions = {k: v for k, v in completions.items() if k not in UNCAPPED}
    reward = CodeExec(timeout_s=5.0, memory_mb=256, max_parallel=2, sandbox=isolation)
    names = list(completions)
    rows = {k: [v] * len(names) for k, v in columns.items()}
    scores = reward([""] * len(names), [_fence(completions[n]) for n in names], **rows)
    return dict(zip(names, scores))


def _expected(hostile: list[str], isolation: str) -> dict[str, float]:
    if isolation == "rlimits" and not _can_drop():
        hostile = [n for n in hostile if n not in UNCAPPED]
    return {**dict.fromkeys(hostile, 0.0), "honest": 1.0}


@pytest.mark.parametrize("isolation", ISOLATION)
def test_asserts_form(isolation):
    hostile = {**COMMON, **{k: v.format(name="f") for k, v in FUNCTION_HOSTILE.items()}}
    scores = _score(isolation, {**hostile, "honest": ASSERTS_HONEST}, tests=ASSERTS)
    assert scores == _expected(list(hostile), isolation)


@pytest.mark.parametrize("isolation", ISOLATION)
def test_check_form(isolation):
    hostile = {**COMMON, **{k: v.format(name="g") for k, v in FUNCTION_HOSTILE.items()}}
    scores = _score(
        isolation, {**hostile, "honest": CHECK_HONEST}, tests=CHECK, entry_point="g", test_setup=CHECK_PRELUDE
    )
    assert scores == _expected(list(hostile), isolation)


@pytest.mark.parametrize("isolation", ISOLATION)
def test_stdio_form(isolation):
    hostile = {**COMMON, **STDIO_HOSTILE}
    scores = _score(isolation, {**hostile, "honest": STDIO_HONEST}, stdio=STDIO)
    assert scores == _expected(list(hostile), isolation)


def test_the_suite_is_large_enough():
    """The issue asks for 30 or more hostile cases across the forms."""
    per_form = len(COMMON) + len(FUNCTION_HOSTILE)
    assert per_form >= 30 and len(COMMON) + len(STDIO_HOSTILE) >= 15
