"""Proof of pass for ``code_exec``: the program computes values, the trainer judges them.

Why not "run the tests after the code and read the exit code": the completion runs first, in the same
process, so it can ``sys.exit(0)``/``os._exit(0)`` before the tests, return objects whose ``__eq__`` is
always True, patch ``assert`` helpers or builtins, or print whatever marker a harness would print.
A per-call secret does not help either: whatever the harness process knows, code in that process can read.

So nothing that decides a pass is ever inside the program. ``plan_tests`` splits the row's tests (in the
trainer) into

* **steps** sent to the program, in order: statements without ``assert`` (imports, assignments) to
  execute, and the *solution-dependent* parts of each assert to evaluate, e.g. ``f(2)`` of
  ``assert f(2) == 4``; and
* **checks** kept here: each top-level ``assert`` (each operand of a top-level ``and`` separately) with
  those parts replaced by the values the program reports, e.g. ``_v[0] == 4``.

``RUNNER`` (in the sandbox) runs the solution, then each step, and writes one line per step to fd 3:
``ok`` / ``ok <repr of a plain value>`` / ``err``. Values must be plain data (None, bool, int, float,
complex, str, bytes and lists/tuples/dicts/sets of them, exact types); anything else is ``err``.
``verify`` scores 1 only if there is exactly one well-formed line per step and every check, evaluated
here on ``ast.literal_eval``-ed values, is exactly ``True`` (type bool). The program never sees an
expected value, so it cannot forge a pass: an early exit leaves lines missing, an always-equal object
is not plain data, extra or repeated lines fail the count.

What a test may contain: top-level ``assert`` statements and other top-level statements without
``assert``; ``plan_tests`` raises ``ValueError`` for an ``assert`` nested in a function or loop (e.g.
HumanEval's ``def check(candidate)``), and for tests with no top-level ``assert``. Inside an assert,
comparisons, ``and``/``or``/``not``, ``+ - / //``, subscripts, literals, ``math.isclose``-style calls
and the calls in ``LOCAL_FUNCTIONS`` are evaluated here; any other sub-expression that names something
(``f(2)``, ``x``, ``obj.attr``, a comprehension) is evaluated by the program as one step. A check that
would be only such a step (``assert all(f(x) == y for ...)``, ``assert is_valid(f(2))``) is refused with
``ValueError``: the program would decide its truth and could forge it. Write ``assert f(x) == literal``
(or ``assert [f(x) for x in xs] == [...]``: the list is reported, the comparison is made here). A check
is as strong as its expected value is hard to guess: ``assert f(2) == True`` can be passed by reporting
True; compare with values a program cannot guess without solving the task.
"""

from __future__ import annotations

import ast
import functools
import json
import math
from dataclasses import dataclass

LOCAL_FUNCTIONS: dict[str, object] = {
    f.__name__: f for f in (abs, len, round, sorted, min, max, sum, all, any, isinstance, set, frozenset, list,
                            tuple, dict, str, float, bool, int)}
"""Calls (on plain values) a check may make here; their names also stand for themselves (``isinstance(x, int)``)."""
MATH_FUNCTIONS: dict[str, object] = {n: getattr(math, n) for n in ("isclose", "isnan", "isinf", "isfinite", "fabs",
                                                                  "floor", "ceil", "sqrt")}
"""``math.<name>`` calls a check may make here."""
_LOCAL_BINOPS = (ast.Add, ast.Sub, ast.Div, ast.FloorDiv)   # not * ** %: a reported value could make
                                                             # them allocate gigabytes here ("x" * 10**10)
_ENV = {"__builtins__": {}, **LOCAL_FUNCTIONS, "math": type("math", (), MATH_FUNCTIONS)}


@dataclass(frozen=True)
class Plan:
    """What the program runs (``steps``: ``("exec" | "eval", source)``) and what is checked here."""

    steps: tuple[tuple[str, str], ...]
    checks: tuple[str, ...]              # expressions over ``_v`` (the reported values, by step index)

    def program_json(self) -> str:
        return json.dumps([list(s) for s in self.steps])


@functools.lru_cache(maxsize=4096)
def plan_tests(tests: str) -> Plan:
    """Split ``tests`` into steps and checks (module docstring); ``ValueError`` for tests it cannot prove."""
    steps: list[tuple[str, str]] = []
    checks: list[str] = []
    for stmt in ast.parse(tests).body:
        if isinstance(stmt, ast.Assert):
            for part in _conjuncts(stmt.test):
                check = _split(part, steps)
                if _decided_by_program(check):
                    raise ValueError(f"code_exec cannot prove `assert {ast.unparse(part)}` (line {stmt.lineno}): "
                                     "the program would compute its truth itself and could forge it; compare "
                                     "with an expected value instead, e.g. `assert f(2) == 4`")
                checks.append(ast.unparse(check))
        elif any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            raise ValueError(f"code_exec tests need each assert at the top level, got one inside "
                             f"{type(stmt).__name__} at line {stmt.lineno}; unroll it into top-level asserts")
        else:
            steps.append(("exec", ast.unparse(stmt)))
    if not checks:
        raise ValueError("code_exec tests have no top-level assert, so nothing proves a pass; "
                         "write them as lines like `assert f(2) == 4`")
    return Plan(tuple(steps), tuple(checks))


def _decided_by_program(check: ast.expr) -> bool:
    """Whether ``check`` is only a reported value's truth (``_v[i]``, ``not _v[i]``, ``bool/all/any(_v[i])``):
    then the program itself computed the verdict (``all(...)``, a test helper) and a forged ``True`` passes."""
    while True:
        if isinstance(check, ast.UnaryOp) and isinstance(check.op, ast.Not):
            check = check.operand
        elif isinstance(check, ast.Call) and isinstance(check.func, ast.Name) \
                and check.func.id in ("bool", "all", "any") and len(check.args) == 1:
            check = check.args[0]
        else:
            break
    return isinstance(check, ast.Subscript) and isinstance(check.value, ast.Name) and check.value.id == "_v"


def _conjuncts(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        return [p for v in node.values for p in _conjuncts(v)]
    return [node]


def _split(node: ast.expr, steps: list[tuple[str, str]]) -> ast.expr:
    """``node`` with every sub-expression that must run in the program replaced by ``_v[i]``."""
    if isinstance(node, (ast.Name, ast.Attribute)) and _local(node):
        return node                       # a local function's name: nothing inside to split
    if _local(node):
        for name, child in ast.iter_fields(node):
            if isinstance(child, ast.expr):
                setattr(node, name, _split(child, steps))
            elif isinstance(child, list):
                setattr(node, name, [_split(c, steps) if isinstance(c, ast.expr) else c for c in child])
        return node
    steps.append(("eval", ast.unparse(node)))
    return ast.Subscript(ast.Name("_v", ast.Load()), ast.Constant(len(steps) - 1), ast.Load())


def _local(node: ast.expr) -> bool:
    """Whether ``node`` itself (its children are split separately) can be evaluated here, on plain data."""
    if isinstance(node, (ast.Constant, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.List, ast.Tuple, ast.Set,
                         ast.Dict, ast.Subscript, ast.Slice)):
        return True
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, _LOCAL_BINOPS)
    if isinstance(node, ast.Name):
        return node.id in LOCAL_FUNCTIONS
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "math" and node.attr in MATH_FUNCTIONS
    if isinstance(node, ast.Call):
        return not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args) and _local(node.func) \
            and not isinstance(node.func, ast.Call)
    return False


def verify(plan: Plan, channel: bytes) -> bool:
    """True only if the program reported every step once, well formed, and every check is exactly True."""
    values = _values(plan, channel)
    return values is not None and all(_check(c, values) for c in plan.checks)


def _values(plan: Plan, channel: bytes) -> list | None:
    try:
        lines = channel.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return None
    if lines[-1] != "" or len(lines) - 1 != len(plan.steps):
        return None
    values = []
    for (kind, _), line in zip(plan.steps, lines):
        if kind == "exec":
            ok = line == "ok"
            values.append(None)
        else:
            ok = line.startswith("ok ")
            try:
                values.append(ast.literal_eval(line[3:]) if ok else None)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
        if not ok:
            return None
    return values


def _check(check: str, values: list) -> bool:
    try:
        result = eval(check, dict(_ENV), {"_v": values})  # noqa: S307 - only nodes _local allows, on plain data
    except Exception:  # noqa: BLE001 - a check that cannot be evaluated on the reported values failed
        return False
    return result is True


RUNNER = r'''
import json, os
_write, _repr, _type, _open = os.write, repr, type, open
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _plain(v):
    t = _type(v)
    if t in _PLAIN:
        return v
    if t in (list, tuple, set, frozenset):
        return t(_plain(x) for x in v)
    if t is dict:
        return {_plain(k): _plain(x) for k, x in v.items()}
    raise TypeError(f"not plain data: {t.__name__}")


def _main():
    steps = json.loads(_open("plan.json").read())
    ns = {"__name__": "__main__"}
    try:
        exec(compile(_open("solution.py").read(), "solution.py", "exec"), ns)
    except BaseException:
        os._exit(1)
    lines = []
    for kind, src in steps:
        try:
            if kind == "exec":
                exec(compile(src, "tests", "exec"), ns)
                lines.append("ok")
            else:
                lines.append("ok " + _repr(_plain(eval(compile(src, "tests", "eval"), ns))))
        except BaseException:
            lines.append("err")
    _write(3, ("\n".join(line.replace("\n", " ") for line in lines) + "\n").encode())
    os._exit(0)


_main()
'''
"""The program run in the sandbox: the solution, then each step, one line per step to fd 3 (see above)."""
