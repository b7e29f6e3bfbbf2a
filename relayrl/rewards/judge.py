"""The judge: the trusted process that runs a row's tests and decides what passed.

It never loads the solution. The solution runs in the sandbox (``rewards.sandbox``) behind a small
server (``harness.SERVER``); every name the tests take from the solution is a ``Stub`` here, and each
call of a stub sends plain arguments to the sandbox and gets back a plain value or an exception name
(``rewards.plain``). Every comparison, ``and``/``or``/``not``, computed expected value, helper and
comprehension of the tests is evaluated here, on plain data, so no object the solution made, and no
output it wrote, can decide a case.

Cases: each executed ``assert`` is one case. ``_SoftAsserts`` rewrites every ``assert X`` into
"record ``bool(X)``, or False if evaluating it raised", so one failed case does not hide the others
(partial credit); an exception that escapes the tests ends the run as incomplete. The verdict:

    passed      cases that held
    total       cases run, +1 if the run ended early (at least the asserts not reached, counted statically)
    complete    the tests ran to their end

Forms (``harness.CodeTests.form``): ``asserts`` (MBPP: top-level statements, solution names stubbed),
``check`` (HumanEval: ``check(candidate)`` called with the entry point's stub) and ``stdio`` (each case
runs the program on an input; its output is compared here).

This file runs as ``python -I -S`` loaded by path (``harness.JUDGE_BOOT``): stdlib and ``.plain`` only.
"""

import ast
import builtins
import ctypes
import importlib
import json
import os
import resource
import signal
import sys
from typing import Any, Protocol

from .plain import dumps, loads  # noqa: TID252 - loaded by path as its own package (harness.JUDGE_BOOT)

MAX_REPLY = 1 << 20
"""Bytes of one reply from the sandbox; a longer one fails that call."""


class Asker(Protocol):
    """What the judge calls the sandbox through (``Channel``; a stand-in in unit tests)."""

    def ask(self, request: list) -> Any: ...


class SolutionError(Exception):
    """The solution failed a call in a way that has no builtin exception name (or sent garbage)."""


class Unsupported(Exception):
    """The tests passed something that is not plain data to the solution: the test form is not provable."""


class Channel:
    """Calls into the sandbox: one request line out, one reply line back."""

    def __init__(self, request_fd: int, reply_fd: int) -> None:
        self.request_fd = request_fd
        self.replies = open(reply_fd, "rb", buffering=1 << 16)  # noqa: SIM115 - read for the process's life

    def ask(self, request: list) -> Any:
        try:
            line = (dumps(request) + "\n").encode()
        except (TypeError, ValueError) as exc:
            raise Unsupported(f"the tests pass {exc} to the solution") from None
        try:
            _write_all(self.request_fd, line)
        except OSError:
            raise SolutionError("the sandbox is gone") from None
        reply = self.replies.readline(MAX_REPLY + 1)
        if not reply.endswith(b"\n"):
            raise SolutionError("no reply")
        status, _, payload = reply[:-1].decode("utf-8", "replace").partition(" ")
        if status == "ok":
            try:
                return loads(payload)
            except ValueError:
                raise SolutionError("malformed reply") from None
        raise _exception(payload) if status == "err" else SolutionError("malformed reply")


class Stub:
    """A solution name in the tests: calling it calls the solution in the sandbox."""

    def __init__(self, channel: Asker, name: str) -> None:
        self._channel, self._name = channel, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.ask(["call", self._name, list(args), kwargs])

    def __repr__(self) -> str:
        return f"<solution function {self._name}>"


def _exception(name: str) -> Exception:
    """The builtin exception class called ``name`` (so ``except ValueError`` in tests works), else one
    carrying the name; never anything the sandbox could make behave differently."""
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
        return cls(f"raised in the solution: {name}")
    return SolutionError(name[:100])


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


class _SoftAsserts(ast.NodeTransformer):
    """``assert X`` -> ``try: __case__(X) except __unsupported__: raise except Exception: __case__(False)``."""

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        record = ast.Expr(ast.Call(ast.Name("__case__", ast.Load()), [node.test], []))
        failed = ast.Expr(ast.Call(ast.Name("__case__", ast.Load()), [ast.Constant(False)], []))
        template = ast.Try(
            body=[record],
            handlers=[
                ast.ExceptHandler(ast.Name("__unsupported__", ast.Load()), None, [ast.Raise()]),
                ast.ExceptHandler(ast.Name("Exception", ast.Load()), None, [failed]),
            ],
            orelse=[],
            finalbody=[],
        )
        return ast.copy_location(template, node)


class Run:
    """One judging: the cases recorded so far and how the tests ended."""

    def __init__(self) -> None:
        self.cases: list[bool] = []
        self.complete = False

    def record(self, value: Any) -> None:
        self.cases.append(bool(value))

    def namespace(self, channel: Asker, names: list[str]) -> dict[str, Any]:
        ns = {
            "__name__": "__tests__",
            "__builtins__": builtins,
            "__case__": self.record,
            "__unsupported__": Unsupported,
        }
        ns.update({name: Stub(channel, name) for name in names})
        return ns

    def verdict(self, static_asserts: int) -> dict[str, Any]:
        passed = sum(self.cases)
        total = len(self.cases) if self.complete else max(len(self.cases) + 1, static_asserts)
        return {"passed": passed, "total": total, "complete": self.complete}


def judge_code(spec: dict[str, Any], channel: Asker) -> dict[str, Any]:
    """Run ``asserts``/``check`` tests against the stubs; the verdict dict."""
    run = Run()
    tree = ast.parse(spec["prelude"] + "\n" + spec["tests"], "tests")
    code = compile(ast.fix_missing_locations(_SoftAsserts().visit(tree)), "tests", "exec")
    ns = run.namespace(channel, spec["names"])
    ns.update({name: importlib.import_module(name) for name in spec["modules"]})
    try:
        exec(code, ns)  # noqa: S102 - the dataset's own tests, in this trusted process
        if spec["form"] == "check":
            ns[spec["entry_point"]] = Stub(channel, spec["entry_point"])
            ns["check"](ns[spec["entry_point"]])
        run.complete = True
    except Unsupported:
        raise
    except Exception:  # noqa: BLE001 - any escape ends the run early; the cases not reached count as failed
        pass
    return run.verdict(spec["asserts"])


def judge_stdio(spec: dict[str, Any], channel: Asker) -> dict[str, Any]:
    """Each case: the program's output on ``input``, compared here with ``output``."""
    run = Run()
    for case_input, expected in spec["cases"]:
        try:
            run.record(same_output(channel.ask(["stdio", case_input]), expected))
        except Exception:  # noqa: BLE001 - a failed call fails its case
            run.record(False)
    run.complete = True
    return run.verdict(len(spec["cases"]))


def same_output(got: Any, expected: str) -> bool:
    """Outputs match line by line, ignoring trailing whitespace on each line and trailing blank lines
    (how CodeContests and APPS compare); ``got`` must be a str."""
    if type(got) is not str:
        return False
    return _lines(got) == _lines(expected)


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _harden(limits: dict[str, int]) -> None:
    """Die with the parent, refuse ptrace and /proc access from other processes, cap memory and CPU."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory"], limits["memory"]))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu"], limits["cpu"]))


def main() -> None:
    """argv: JSON ``{request, reply, verdict}`` fds; stdin: the spec (with the parent's nonce)."""
    fds = json.loads(sys.argv[1])
    spec = json.loads(sys.stdin.read())
    _harden(spec["limits"])
    _write_all(fds["verdict"], b"ready\n")
    channel = Channel(fds["request"], fds["reply"])
    try:
        verdict = (judge_stdio if spec["form"] == "stdio" else judge_code)(spec, channel)
    except Unsupported as exc:
        verdict = {"unsupported": str(exc)[:300]}
    _write_all(fds["verdict"], f"{spec['nonce']} {json.dumps(verdict)}\n".encode())
