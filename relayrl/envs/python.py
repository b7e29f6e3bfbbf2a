"""A Python interpreter tool, run in the code-reward sandbox, and the environment that offers it.

Each call runs the model's code as a fresh program in ``relayrl.rewards.sandbox`` (the sandbox
``code_exec`` scores with): ``isolation="auto"`` is full isolation (namespaces, an allowlist root, no
network, a process cap) or an error at construction; ``"rlimits"`` accepts weaker isolation knowingly
(docs/rewards.md). Nothing carries over between calls: no variables, no files. The program sees the
standard library only (``python -I -S``, site-packages masked).

What comes back is text, never an exception: stdout, then the last lines of stderr when the program
failed (the traceback's last lines), then how it ended when that was not a normal exit (a time limit,
a signal). A program whose last statement is an expression also prints that value's ``repr``, as a
REPL would, so ``3*7`` reads back ``21``. ``relayrl.envs.sanitize.sanitize_output`` makes every output safe
to append to the model's context: decoded, control characters escaped, chat-template role markers broken
up, and cut to a character budget.
"""

from __future__ import annotations

import signal
from typing import Any

from relayrl.envs.sanitize import sanitize_output
from relayrl.envs.toolenv import ToolEnv
from relayrl.envs.tools import ToolError

MAX_CODE_CHARS = 20_000
"""Longer code is refused before anything runs (a model turn is never legitimately this long)."""
TIMEOUT_MARGIN_S = 5.0
"""``PythonEnv``'s default ``tool_timeout_s`` is ``timeout_s`` plus this: the sandbox's own start-up and clean-up."""
STDERR_LINES = 5
"""How many of stderr's last lines a failed program's output shows: the traceback's end says what went wrong."""

CELL = "cell.py"
"""The model's code is this file in the sandbox's working dir; ``RUNNER`` (the sandbox's ``main.py``) runs it."""
RUNNER = """\
import ast, linecache, os, sys, traceback
NAME = "cell.py"
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), NAME)) as f:
    source = f.read()
linecache.cache[NAME] = (len(source), None, source.splitlines(True), NAME)
scope = {"__name__": "__main__"}
try:
    tree = ast.parse(source, NAME)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, NAME, "exec"), scope)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), NAME, "eval"), scope)
        if value is not None:
            print(repr(value))
except SystemExit:
    raise
except BaseException as exc:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != NAME:
        tb = tb.tb_next
    sys.stdout.flush()
    traceback.print_exception(type(exc), exc, tb)
    sys.exit(1)
"""
"""Runs ``cell.py`` as ``__main__``, printing the ``repr`` of a final expression's value (unless None) as a
REPL would. A traceback shows only the cell's own frames, as ``cell.py`` (no host paths, no runner). Parsing
happens here, inside the sandbox, so hostile source never reaches the host's parser."""

# --- running code -----------------------------------------------------------------------------------


def check_isolation(isolation: str) -> int:
    """The sandbox level ``isolation`` gives on this host (2 namespaces, 1 rlimits), or a one-line
    ``ValueError`` naming the fix: ``auto`` without full isolation fails closed, as ``code_exec`` does."""
    from relayrl.rewards.sandbox import LEVELS, MODES, namespaces_available, namespaces_missing

    if isolation not in MODES:
        raise ValueError(
            f"python tool isolation={isolation!r} is not a sandbox mode; set env.kwargs.isolation to one of "
            f"{', '.join(MODES)}"
        )
    if isolation == "auto" and not namespaces_available():
        raise ValueError(
            f"python tool isolation=auto needs full isolation, which this host lacks "
            f"({namespaces_missing() or 'unshare(2) failed'}); run the rollout actors as root on a host that "
            "allows unshare(2), or set env.kwargs.isolation=rlimits to accept weaker isolation knowingly "
            "(docs/environments.md)"
        )
    return LEVELS["namespaces" if isolation == "auto" else "rlimits"]


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    isolation: str = "auto",
    memory_mb: int = 256,
    max_output_chars: int = 1000,
    max_procs: int = 16,
) -> str:
    """Run ``code`` in the sandbox and return what it printed, sanitized to ``max_output_chars``.

    Raises ``ToolError`` only for code that cannot be a program (empty, or over ``MAX_CODE_CHARS``);
    everything the program does, crashes and time limits included, comes back as text.
    """
    from relayrl.rewards.sandbox import run_sandboxed

    if not code.strip():
        raise ToolError("empty code; pass the program as the code argument and print() what you need")
    if len(code) > MAX_CODE_CHARS:
        raise ToolError(f"code has {len(code)} characters; at most {MAX_CODE_CHARS}")
    output_limit = max(4 * max_output_chars, 16 * 1024)
    result = run_sandboxed(
        RUNNER,
        timeout_s=timeout_s,
        isolation=isolation,
        memory_mb=memory_mb,
        output_limit=output_limit,
        files={CELL: code},
        max_procs=max_procs,
    )
    return sanitize_output(_report(result, timeout_s, output_limit), max_output_chars)


def _report(result: Any, timeout_s: float, output_limit: int) -> str:
    """A ``SandboxResult`` as the text the model reads: stdout, stderr's end on failure, how it ended."""
    parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
    if not result.ok and result.stderr.strip():
        parts.append("\n".join(result.stderr.rstrip().splitlines()[-STDERR_LINES:]))
    if "[Errno 27] File too large" in result.stderr:  # RLIMIT_FSIZE: a write past output_limit fails
        parts.append(f"(output is limited to {output_limit} bytes)")
    if ending := _ending(result, timeout_s):
        parts.append(ending)
    return "\n".join(parts) if parts else "(no output; print() what you need to see)"


def _ending(result: Any, timeout_s: float) -> str | None:
    """How the program ended when that needs saying: a time limit, a signal, a silent nonzero exit."""
    rc = result.returncode
    if result.timed_out:
        return f"timed out after {timeout_s:g} s"
    if not rc:
        return None
    # rlimits reports a signal as -N; at namespaces the sandbox's boot process exits 128 + N for it
    signum = -rc if rc < 0 else rc - 128 if result.isolation == "namespaces" and 128 < rc < 160 else 0
    if signum:
        return _signal_note(signum, timeout_s)
    return None if result.stderr.strip() else f"exited with status {rc}"


def _signal_note(signum: int, timeout_s: float) -> str:
    """Why a program died of ``signum``; the sandbox's RLIMIT_CPU sends SIGXCPU (then SIGKILL)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if signum == signal.SIGXCPU:
        return f"killed by {name}: over its CPU time limit (about {timeout_s:g} s)"
    return f"killed by {name}"


# --- the environment --------------------------------------------------------------------------------

INSTRUCTIONS = (
    "You can run Python code with the python tool: each call runs a fresh program (standard library only, "
    "no network, nothing kept between calls, {timeout_s:g} s at most) and returns what it prints, or the "
    "value of its last expression. When you are done, give your final answer as 'Answer: N' without "
    "calling the tool."
)


class PythonEnv(ToolEnv):
    """Arithmetic with a Python interpreter: needs the ``answer`` column (an integer), e.g. ``data.task=arith``.

    A turn with a python call gets the program's output back (reward 0, the episode goes on); a turn with
    no call is the final answer: reward 1.0 if the integer after its last ``Answer:`` equals ``answer``
    (``relayrl.rewards.builtin.parse_answer``, as ``arith_correct`` and ``CalculatorEnv``), else 0.0.

    ``isolation``: ``auto`` (full isolation, or a ``ValueError`` here, at construction) | ``rlimits``
    (weaker, accepted knowingly); ``level`` holds the result (2 or 1, as ``reward/sandbox_isolation``).
    ``timeout_s``, ``memory_mb``, ``max_procs``: each program's limits; ``max_output_chars``: the budget of
    each output the model reads back. ``kw`` go to ``ToolEnv`` (``tool_timeout_s`` defaults to ``timeout_s``
    plus ``TIMEOUT_MARGIN_S``, so the sandbox's own time limit is what ends a slow program).
    """

    def __init__(
        self,
        timeout_s: float = 5.0,
        isolation: str = "auto",
        max_output_chars: int = 1000,
        memory_mb: int = 256,
        max_procs: int = 16,
        **kw: Any,
    ) -> None:
        kw.setdefault("tool_timeout_s", timeout_s + TIMEOUT_MARGIN_S)
        kw.setdefault("max_result_chars", max_output_chars)
        if kw["tool_timeout_s"] <= timeout_s:
            raise ValueError(
                f"PythonEnv tool_timeout_s={kw['tool_timeout_s']} must exceed timeout_s={timeout_s}, or the env gives "
                "up on a program the sandbox is still running; raise env.kwargs.tool_timeout_s or leave it unset"
            )
        super().__init__(**kw)
        self.level = check_isolation(isolation)  # fails closed now, before any episode runs
        self.timeout_s, self.isolation, self.max_output_chars = timeout_s, isolation, max_output_chars
        self.memory_mb, self.max_procs = memory_mb, max_procs
        self.tools = [self.python]

    def python(self, code: str) -> str:
        """Run a Python program (standard library only) and return what it prints.

        Each call is a fresh program: no variables or files carry over.
        A final expression's value is printed too, so `2**10` returns 1024.

        Args:
            code: The complete Python program to run.
        """
        return run_python(
            code,
            timeout_s=self.timeout_s,
            isolation=self.isolation,
            memory_mb=self.memory_mb,
            max_output_chars=self.max_output_chars,
            max_procs=self.max_procs,
        )

    def reset(self, sample: dict[str, Any]) -> str:
        _answer(sample)  # a row without an integer answer fails now, not at the episode's last turn
        return super().reset(sample)

    def instructions(self, sample: dict[str, Any]) -> str:
        return INSTRUCTIONS.format(timeout_s=self.timeout_s)

    def finish(self, action: str) -> tuple[str, float, bool]:
        from relayrl.rewards.builtin import parse_answer

        return "", float(parse_answer(action) == _answer(self.sample)), True


def _answer(sample: dict[str, Any]) -> int:
    """The row's integer ``answer``, or a ``ValueError`` naming the fix."""
    try:
        return int(str(sample["answer"]).strip().replace(",", ""))
    except (KeyError, ValueError):
        raise ValueError(
            f"PythonEnv needs an integer 'answer' column, the sample has {sorted(sample)} "
            f"(answer={sample.get('answer')!r}); use data.task=arith or a jsonl file with integer answers"
        ) from None
