"""Proof of pass for ``code_exec``: the tests run in a trusted judge, the solution in a sandbox.

Why not "run the solution, then the tests, and read the exit code": in one process the solution can
``sys.exit(0)`` first, return objects whose ``__eq__`` is always True, patch builtins, or print whatever
a harness would print; and anything its process knows (a secret, the expected values) it can read.

So the solution and the tests never share a process or a namespace::

    reward worker ── spec + nonce ──▶ judge (python -I -S, trusted)      sandbox (rewards.sandbox)
         ▲                              runs the row's tests; names  ──call f(2)──▶ server: the solution
         └──────── nonce + verdict ──── the solution defines are      ◀──ok 4────── loaded once, answers
                                        stubs                                       calls with plain data

* The judge (``rewards.judge``) executes the tests unchanged: computed expected values, variables,
  helpers, ``or``/``not``, comprehensions, HumanEval's ``check(candidate)``. It never loads the solution.
* Each call of a stub crosses as one line of plain data (``rewards.plain``): arguments out, a value or an
  exception's name back. No object with behaviour, and nothing the solution prints, reaches the judge.
* The judge's verdict goes to the reward worker on a pipe of its own, prefixed with a nonce that only the
  worker and the judge hold; the sandbox can reach neither process (its own pid namespace and uid).

Test forms (``plan_tests``), each accepted as datasets ship them:

* ``asserts`` (MBPP): statements with ``assert``\\ s; every name they use but do not define (and that is
  not a builtin) is the solution's, except a standard-library module the tests use without calling it
  (``math.isclose`` where the solution imported ``math``), which the judge imports itself. ``prelude``
  (MBPP's ``test_setup_code`` or ``test_imports``) runs first, in the judge.
* ``check`` (HumanEval): ``prelude`` (the problem's prompt: trusted helpers such as ``poly``) and the
  tests define ``check``; the judge calls ``check(<entry point's stub>)``.
* ``stdio`` (APPS, CodeContests): (input, expected output) cases; the program runs as ``__main__`` on
  each input in the sandbox and its output is compared in the judge (``judge.same_output``).

What a test cannot do: pass something that is not plain data to the solution (a lambda, an object), or
use a solution's value that is not returned by a call (a module constant, an object's attribute). The
first is reported as an unsupported test (``ValueError``); the second fails its case.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import json
import os
import secrets
import select
import subprocess
import symtable
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayrl.rewards import plain
from relayrl.rewards.sandbox import resolve_isolation, start_sandboxed

FORMS = ("asserts", "check", "stdio")

SERVER = r"""
import io, os, sys
_REQUESTS, _REPLIES = 3, 4


def _reply(line):
    data = (line.replace("\n", " ") + "\n").encode("utf-8", "replace")
    while data:
        data = data[os.write(_REPLIES, data):]


def _run_script(code, text):
    out, saved = io.StringIO(), (sys.stdin, sys.stdout)
    sys.stdin, sys.stdout = io.TextIOWrapper(io.BytesIO(text.encode())), out
    try:
        exec(code, {"__name__": "__main__"})
    except SystemExit:
        pass
    finally:
        sys.stdin, sys.stdout = saved
    return out.getvalue()


def _serve():
    ns, failed = {"__name__": "solution"}, None
    try:
        code = compile(open("solution.py").read(), "solution.py", "exec")
        if MODE != "stdio":
            exec(code, ns)
    except BaseException as exc:
        failed = type(exc).__name__
    for line in open(_REQUESTS, "rb"):
        try:
            if failed:
                raise RuntimeError(failed)
            request = loads(line.decode())
            if request[0] == "stdio":
                result = _run_script(code, request[1])
            else:
                result = ns[request[1]](*request[2], **request[3])
            _reply("ok " + dumps(result))
        except BaseException as exc:
            _reply("err " + type(exc).__name__)


_serve()
"""
"""The sandbox's program, run after ``plain``'s source: load the solution, answer the judge's calls."""

JUDGE_BOOT = (
    "import importlib, sys, types\n"
    "pkg = types.ModuleType('relayrl_judge'); pkg.__path__ = [sys.argv[2]]\n"
    "sys.modules['relayrl_judge'] = pkg\n"
    "importlib.import_module('relayrl_judge.judge').main()\n"
)
"""Loads ``judge.py`` (and its ``.plain``) by path: ``python -I -S`` never imports the relayrl package."""


@dataclass(frozen=True)
class CodeTests:
    """A row's tests, checked and normalised (``plan_tests``); what the judge receives."""

    form: str  # one of FORMS
    tests: str = ""  # asserts / check: the test code
    prelude: str = ""  # trusted code run first, in the judge
    entry_point: str | None = None  # check: the function passed as ``candidate``
    names: tuple[str, ...] = ()  # the solution's names the tests call
    cases: tuple[tuple[str, str], ...] = ()  # stdio: (input, expected output)
    asserts: int = 0  # asserts / check: how many ``assert`` statements the tests hold
    modules: tuple[str, ...] = ()  # asserts: stdlib modules the tests use unimported (``math.isclose``)

    def payload(self) -> dict[str, Any]:
        """What the judge reads (``rewards.judge``), as JSON-able data."""
        return {
            "form": self.form,
            "tests": self.tests,
            "prelude": self.prelude,
            "entry_point": self.entry_point,
            "names": list(self.names),
            "cases": [list(c) for c in self.cases],
            "asserts": self.asserts,
            "modules": list(self.modules),
        }


@dataclass(frozen=True)
class Verdict:
    """``passed`` of ``total`` cases held; ``complete``: the tests ran to their end (``rewards.judge``)."""

    passed: int
    total: int
    complete: bool

    @property
    def ok(self) -> bool:
        return self.complete and self.total > 0 and self.passed == self.total

    @property
    def credit(self) -> float:
        return self.passed / self.total if self.total else 0.0


FAILED = Verdict(0, 1, False)
"""No verdict (timeout, a judge killed or answering without the nonce): nothing passed."""


def plan_tests(
    tests: str | list[str] | None = None,
    entry_point: str | None = None,
    prelude: str | list[str] | None = None,
    stdio: Any = None,
) -> CodeTests:
    """The row's tests as a ``CodeTests``; ``ValueError`` (one line: cause and fix) for tests that cannot
    prove a pass. ``tests`` and ``prelude`` may be lists of statements (MBPP's ``test_list``,
    ``test_imports``); ``stdio`` pairs (input,
    output), ``{"input", "output"}`` dicts, ``{"inputs": [...], "outputs": [...]}`` (APPS), or its JSON."""
    if stdio is not None:
        return CodeTests("stdio", cases=_stdio_cases(stdio))
    code = "\n".join(tests) if isinstance(tests, list) else (tests or "")
    setup = "\n".join(prelude) if isinstance(prelude, list) else (prelude or "")
    return _plan_code(code, entry_point or None, setup)


@functools.lru_cache(maxsize=1024)
def _plan_code(code: str, entry_point: str | None, prelude: str) -> CodeTests:
    """``plan_tests`` for asserts and check forms, once per distinct tests: a group's completions share
    their row's tests, and each completion is planned before it is judged."""
    combined = _parse(prelude + "\n" + code)
    asserts = sum(isinstance(n, ast.Assert) for n in ast.walk(_parse(code)))
    if entry_point:
        if not entry_point.isidentifier():
            raise ValueError(
                f"code_exec entry_point {entry_point!r} is not a function name; map the column "
                "holding the tested function's name"
            )
        if not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in combined.body):
            raise ValueError(
                "code_exec tests with an entry_point must define `def check(candidate)` "
                "(HumanEval's form); drop entry_point for top-level asserts"
            )
        return CodeTests("check", code, prelude, entry_point, (entry_point,), asserts=asserts)
    if not asserts:
        raise ValueError(
            "code_exec tests have no assert, so nothing proves a pass; write them as lines like "
            "`assert f(2) == 4`, or give stdio cases"
        )
    free = solution_names(code, prelude)
    modules = tuple(n for n in free if n in sys.stdlib_module_names and n not in _called(combined))
    names = tuple(n for n in free if n not in modules)
    return CodeTests("asserts", code, prelude, None, names, asserts=asserts, modules=modules)


def solution_names(tests: str, prelude: str = "") -> tuple[str, ...]:
    """Names the tests use without defining them (nor builtins): the solution's, stubbed in the judge."""
    top = symtable.symtable(prelude + "\n" + tests, "tests", "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    used: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        used.update(s.get_name() for s in table.get_symbols() if s.is_referenced() and (table is top or s.is_global()))
    return tuple(sorted(n for n in used - defined if not hasattr(builtins, n)))


def judge(spec: CodeTests, code: str, timeout_s: float = 5.0, memory_mb: int = 512, isolation: str = "auto") -> Verdict:
    """Run ``code`` against ``spec`` (module docstring) within ``timeout_s`` in all; ``ValueError`` when
    the tests pass something that is not plain data to the solution."""
    request_r, request_w = os.pipe()
    reply_r, reply_w = os.pipe()
    verdict_r, verdict_w = os.pipe()
    deadline = time.monotonic() + timeout_s
    nonce = secrets.token_hex(16)
    try:
        proc = _start_judge(spec, nonce, memory_mb, timeout_s, request_w, reply_r, verdict_w)
    finally:
        for fd in (request_w, reply_r, verdict_w):
            os.close(fd)
    try:
        with os.fdopen(verdict_r, "rb", buffering=0) as verdicts:
            if resolve_isolation(isolation) == 1 and _line(verdicts, deadline) != b"ready":
                return FAILED  # level 1: the judge hides itself before the program runs
            running = start_sandboxed(
                plain_program("stdio" if spec.form == "stdio" else "functions"),
                timeout_s=timeout_s,
                memory_mb=memory_mb,
                isolation=isolation,
                files={"solution.py": code},
                fds={3: request_r, 4: reply_w},
            )
            os.close(request_r)
            os.close(reply_w)
            request_r = reply_w = -1
            try:
                return _verdict(_verdict_line(verdicts, deadline), nonce)
            finally:
                running.finish(0.0)
    finally:
        _kill(proc)
        for fd in (request_r, reply_w):
            if fd >= 0:
                os.close(fd)


def plain_program(mode: str) -> str:
    """The sandbox's ``main.py``: the plain-data codec, the mode, and ``SERVER``."""
    return f"{Path(plain.__file__).read_text()}\nMODE = {mode!r}\n{SERVER}"


def _start_judge(
    spec: CodeTests, nonce: str, memory_mb: int, timeout_s: float, request_w: int, reply_r: int, verdict_w: int
) -> subprocess.Popen:
    fds = {"request": request_w, "reply": reply_r, "verdict": verdict_w}
    limits = {"memory": max(memory_mb, 512) * 2**21, "cpu": int(timeout_s) + 2}
    payload = {**spec.payload(), "nonce": nonce, "limits": limits}
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", JUDGE_BOOT, json.dumps(fds), str(Path(__file__).parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        pass_fds=tuple(fds.values()),
        start_new_session=True,
    )
    try:
        proc.stdin.write(json.dumps(payload).encode())  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
    except OSError:
        pass  # it died: no "ready" line, FAILED
    return proc


def _line(f: Any, deadline: float, limit: int = 4096) -> bytes | None:
    """One line from the judge's verdict pipe by ``deadline``, without its newline; None otherwise."""
    data = b""
    while not data.endswith(b"\n") and len(data) <= limit:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([f], [], [], wait)[0]:
            return None
        chunk = f.read(1)
        if not chunk:
            return None
        data += chunk
    return data[:-1] if data.endswith(b"\n") else None


def _verdict_line(f: Any, deadline: float) -> bytes | None:
    line = _line(f, deadline)
    return _line(f, deadline) if line == b"ready" else line


def _verdict(line: bytes | None, nonce: str) -> Verdict:
    prefix = nonce.encode() + b" "
    if line is None or not line.startswith(prefix):
        return FAILED
    out = json.loads(line[len(prefix) :])
    if "unsupported" in out:
        raise ValueError(
            f"code_exec cannot run these tests: {out['unsupported']}; pass only plain data "
            "(numbers, strings, lists, dicts...) to the solution"
        )
    return Verdict(int(out["passed"]), int(out["total"]), bool(out["complete"]))


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, 9)
    proc.wait()


def _stdio_cases(stdio: Any) -> tuple[tuple[str, str], ...]:
    if isinstance(stdio, str):
        try:
            stdio = json.loads(stdio)
        except json.JSONDecodeError:
            raise ValueError("code_exec stdio is a string but not JSON; give [[input, output], ...]") from None
    if isinstance(stdio, dict):
        if stdio.get("fn_name"):
            raise ValueError("code_exec stdio cases name a function (APPS call-based); write them as asserts")
        inputs, outputs = stdio.get("inputs", []), stdio.get("outputs", [])
        stdio = list(zip(inputs, outputs)) if len(inputs) == len(outputs) else []
    cases = [(c["input"], c["output"]) if isinstance(c, dict) else tuple(c) for c in stdio]
    if not cases or any(len(c) != 2 or not all(isinstance(x, str) for x in c) for c in cases):
        raise ValueError(
            "code_exec stdio needs at least one (input, output) case of two strings; "
            'give [[input, output], ...] or {"inputs": [...], "outputs": [...]}'
        )
    return tuple((i, o) for i, o in cases)


def _parse(code: str) -> ast.Module:
    try:
        return ast.parse(code)
    except SyntaxError as exc:
        raise ValueError(
            f"code_exec tests do not parse (line {exc.lineno}: {exc.msg}); fix the dataset's tests"
        ) from None


def _called(tree: ast.Module) -> set[str]:
    """Names the tests call directly (``f(2)``): a solution function, even one named like a module."""
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
