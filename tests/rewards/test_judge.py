"""The judge's parts by hand-worked cases: the plain-data codec, which names are the solution's, the
test forms accepted or refused at plan time, how cases count, and stdout comparison."""

from __future__ import annotations

import math
import os

import pytest

from relayrl.rewards import harness, judge, plain
from relayrl.rewards.harness import FAILED, CodeTests, Verdict, plan_tests, solution_names


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -7,
        2**80,
        1.5,
        -0.0,
        math.inf,
        "é\n'\"",
        b"\x00\xff",
        1 + 2j,
        [1, [2, (3,)]],
        {"a": {1, 2}, 3: frozenset({4})},
        (),
    ],
)
def test_plain_values_round_trip_with_their_exact_types(value):
    back = plain.loads(plain.dumps(value))
    assert back == value and type(back) is type(value) and "\n" not in plain.dumps(value)


def test_nan_round_trips():
    assert math.isnan(plain.loads(plain.dumps(float("nan"))))


@pytest.mark.parametrize(
    "value", [object(), type("S", (str,), {})("x"), type("I", (int,), {})(1), [1, object()], {1: len}]
)
def test_anything_with_behaviour_is_refused(value):
    with pytest.raises(TypeError):
        plain.dumps(value)


def test_iterators_are_drained_into_lists():
    assert plain.loads(plain.dumps(x * x for x in range(3))) == [0, 1, 4]


@pytest.mark.parametrize(
    "line",
    [
        "",
        "[",
        "5",
        '["int"]',
        '["int", 5]',
        '["str", 1]',
        '["list", [["x", 1]]]',
        '["set", [["list", []]]]',
        '["dict", [[1]]]',
        '["float", "zz"]',
        "[" * 5000 + "]" * 5000,
        '["int", "' + "9" * 6000 + '"]',
    ],
)
def test_malformed_lines_are_refused(line):
    with pytest.raises(ValueError, match="malformed plain value"):
        plain.loads(line)


def test_solution_names_are_the_tests_free_names():
    tests = (
        "import math\nfrom os import path\nexpected = 8\ndef helper(v):\n    return g(v) + w\n"
        "class K:\n    pass\nassert f(3) == expected and math.isclose(h(1), 1.0)\n"
        "assert all(f(x) == y for x, y in pairs())\nassert len(helper(2)) == K and print"
    )
    assert solution_names(tests, prelude="w = 1") == ("f", "g", "h", "pairs")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tests": "x = 1"}, "have no assert"),
        (
            {
                "tests": "assert f(1) ==",
            },
            "do not parse",
        ),
        ({"tests": "assert f(1) == 1", "entry_point": "f"}, "must define `def check"),
        ({"tests": "def check(c):\n    assert c(1)", "entry_point": "f(1)"}, "is not a function name"),
        ({"stdio": []}, "at least one"),
        ({"stdio": [["1", 2]]}, "two strings"),
        ({"stdio": '{"inputs": ["1"], "outputs": ["1"], "fn_name": "f"}'}, "call-based"),
        ({"stdio": "not json"}, "not JSON"),
    ],
)
def test_tests_that_cannot_prove_a_pass_are_refused_at_plan_time(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_tests(**kwargs)


def test_the_forms_users_bring():
    mbpp = plan_tests(["assert f(1) == 2", "assert f(2) == 3"], prelude="import re")
    assert (mbpp.form, mbpp.tests, mbpp.prelude, mbpp.names) == (
        "asserts",
        "assert f(1) == 2\nassert f(2) == 3",
        "import re",
        ("f",),
    )
    assert mbpp.asserts == 2
    human_eval = plan_tests("def check(candidate):\n    assert candidate(1)", "g", "def g(x):\n    pass\n")
    assert (human_eval.form, human_eval.names, human_eval.entry_point) == ("check", ("g",), "g")
    apps = plan_tests(stdio='{"inputs": ["1\\n", "2\\n"], "outputs": ["1\\n", "4\\n"]}')
    assert apps == CodeTests("stdio", cases=(("1\n", "1\n"), ("2\n", "4\n")))
    assert plan_tests(stdio=[{"input": "a", "output": "b"}]).cases == (("a", "b"),)


def test_verdict_arithmetic():
    assert Verdict(3, 3, True).ok and Verdict(3, 3, True).credit == 1.0
    assert not Verdict(2, 3, True).ok and Verdict(2, 3, True).credit == pytest.approx(2 / 3)
    assert not Verdict(2, 2, False).ok  # the tests never reached their end
    assert not Verdict(0, 0, True).ok and Verdict(0, 0, True).credit == 0.0
    assert not FAILED.ok and FAILED.credit == 0.0


class _Replies:
    """A channel standing in for the sandbox: answers each call from a function (unit test only)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def ask(self, request):
        self.calls.append(request)
        return self.fn(*request[2]) if request[0] == "call" else self.fn(request[1])


def _run(spec: CodeTests, fn) -> dict:
    as_dict = spec.payload()
    channel = _Replies(fn)
    run = judge.judge_stdio if spec.form == "stdio" else judge.judge_code
    return run(as_dict, channel)


def test_a_module_the_solution_imported_is_the_judges_own_and_a_function_named_like_one_is_a_stub():
    spec = plan_tests("assert math.isclose(f(2), 4.0)\nassert string(1) == 'x'", prelude=["import re"])
    assert (spec.names, spec.modules, spec.prelude) == (("f", "string"), ("math",), "import re")
    assert _run(spec, lambda x: 4.0 if x == 2 else "x") == {"passed": 2, "total": 2, "complete": True}
    assert _run(spec, lambda x: 3.9)["passed"] == 0


def test_each_assert_is_a_case_and_one_failure_hides_no_other():
    spec = plan_tests("assert f(1) == 1\nassert f(2) == 4\nassert f(3) == 9 or f(3) == -9\nassert not f(0)")
    assert _run(spec, lambda x: x * x) == {"passed": 4, "total": 4, "complete": True}
    assert _run(spec, lambda x: x) == {"passed": 2, "total": 4, "complete": True}  # f(1), not f(0)


def test_an_escaping_error_ends_the_run_and_counts_what_was_not_reached():
    spec = plan_tests("assert f(1) == 1\ny = f(2)\nassert y == 4\nassert f(3) == 9")

    def broken(x):
        if x == 2:
            raise judge.SolutionError("ZeroDivisionError")
        return x * x

    assert _run(spec, broken) == {"passed": 1, "total": 3, "complete": False}


def test_a_solution_exception_is_the_builtin_class_so_tests_can_expect_it():
    spec = plan_tests("try:\n    f(-1)\n    ok = False\nexcept ValueError:\n    ok = True\nassert ok")

    def raises(x):
        raise judge._exception("ValueError")

    assert _run(spec, raises)["passed"] == 1
    assert isinstance(judge._exception("SystemExit"), judge.SolutionError)  # not a BaseException
    assert isinstance(judge._exception("ArbitraryName"), judge.SolutionError)


def test_check_form_calls_check_with_the_stub_and_keeps_trusted_helpers():
    prelude = "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\ndef root(xs):\n    pass\n"
    tests = (
        "def check(candidate):\n    for xs in ([1, 2], [-2, 1]):\n        assert abs(poly(xs, candidate(xs))) < 1e-6\n"
    )
    spec = plan_tests(tests, "root", prelude)
    assert _run(spec, lambda xs: -xs[0] / xs[1]) == {"passed": 2, "total": 2, "complete": True}
    assert _run(spec, lambda xs: 0.0)["passed"] == 0


def test_stdio_cases_compare_output_here():
    spec = plan_tests(stdio=[["1 2\n", "3\n"], ["2 2\n", "4"]])
    assert _run(spec, lambda text: f"{sum(map(int, text.split()))}  \n\n") == {
        "passed": 2,
        "total": 2,
        "complete": True,
    }
    assert _run(spec, lambda text: "3\n") == {"passed": 1, "total": 2, "complete": True}


@pytest.mark.parametrize(
    "got, expected, same",
    [
        ("3\n", "3", True),
        ("3 \n\n\n", "3\n", True),
        ("3\n4", "3\n4\n", True),
        (" 3\n", "3\n", False),
        ("3\n\n4\n", "3\n4\n", False),
        (3, "3", False),
        ("", "", True),
    ],
)
def test_same_output(got, expected, same):
    assert judge.same_output(got, expected) is same


def test_non_plain_arguments_make_the_test_unsupported():
    spec = plan_tests("assert f(lambda v: v) == 1")
    with pytest.raises(judge.Unsupported):
        judge.judge_code(
            spec.payload(),
            judge.Channel(*_closed_pipe()),
        )


def _closed_pipe() -> tuple[int, int]:
    read, write = os.pipe()
    return write, read


def test_an_unsupported_test_is_one_line_from_the_reward():
    spec = plan_tests("assert f(lambda v: v) == 1")
    with pytest.raises(
        ValueError, match=r"^code_exec cannot run these tests: the tests pass not plain data: function to the solution"
    ):
        harness.judge(spec, "def f(g):\n    return 1\n", isolation="rlimits")
