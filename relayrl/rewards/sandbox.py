"""Run untrusted code (a model's completion) in a subprocess, isolated, failing closed.

Two isolation levels (``SandboxResult.level``; the scorer logs it as ``reward/sandbox_isolation``):

* **2, namespaces** (``sandbox=auto``; needs root and working ``unshare(2)``): new mount, pid and
  network namespaces, then a new user namespace, as a uid of its own (``sandbox_uid``: no other
  sandbox, no trainer process shares it) with no capabilities:

  - files: an **allowlist root**. The program's ``/`` is a fresh tmpfs holding, read-only, only the
    interpreter's prefix (its ``site-packages`` masked by an empty tmpfs), the system library dirs
    (``/usr/lib``, ``/lib``, ``/lib64``: libc and the stdlib's extension libraries), ``/etc/ld.so.cache``,
    ``/dev/{null,zero,random,urandom}``, a fresh ``/proc`` of its own pid namespace, and its working dir
    ``/tmp/box``: a tmpfs capped at ``disk_mb`` holding the task's files. The trainer's root is
    unmounted (``pivot_root``), so nothing else exists to be read: no datasets, venv, run dirs, ``/root``;
  - network: an empty network namespace (loopback down);
  - processes: a fresh pid namespace whose init is the program; when it exits, or the sandbox's boot
    process dies (timeout, or the reward worker that started it was killed: ``PR_SET_PDEATHSIG``), the
    kernel kills every process in it, ``setsid`` and double-forked children included, and the tmpfs
    files vanish with the mount namespace. RLIMIT_NPROC caps the sandbox's own uid at ``max_procs``.
* **1, rlimits** (``sandbox=rlimits``, chosen knowingly; any host): the program runs in its own session
  with rlimits and an in-process ``socket`` guard (stops accidents, not a determined program). Run as
  root where other uids can run the interpreter, it first drops to its own uid (so it cannot read
  root-only files, signal or trace the trainer, the judge or other sandboxes, and RLIMIT_NPROC applies);
  otherwise it runs as the trainer's user, with no process cap (RLIMIT_NPROC would count the trainer's
  processes) and the power to read, signal or trace whatever that user can. The filesystem is as visible as to that uid,
  and a child that calls ``setsid`` escapes the time-limit kill.

``resolve_isolation("auto")`` raises on a host without level 2: the product never falls back silently.

Both levels: RLIMIT_AS (``memory_mb``: a larger allocation raises MemoryError), RLIMIT_CPU, RLIMIT_FSIZE
(``output_limit``), RLIMIT_NOFILE, no core dumps, ``python -I -S``, a minimal environment, stdin closed,
a wall-clock ``timeout_s`` after which everything is SIGKILLed. Descriptors of the caller's choosing
(``fds``: target number -> caller's fd) are passed in, e.g. the pipes ``rewards.harness`` talks over.

Host-side leftovers (the ``relayrl-sandbox-<pid>-*`` temp dir that stages the files) are removed on
return; a dir whose owning process died is swept by the next sandbox started on the host.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

MODES: tuple[str, ...] = ("auto", "rlimits")
"""``auto``: full isolation (level 2) or an error; ``rlimits``: level 1, weaker isolation accepted knowingly."""
LEVELS: dict[str, int] = {"namespaces": 2, "rlimits": 1}
"""The number ``reward/sandbox_isolation`` logs for each isolation level."""
UID_BASE, UID_SPAN = 200_000, 100_000
"""Sandbox uids: ``UID_BASE + n`` (see ``sandbox_uid``), outside the ranges distributions hand out."""
SYSTEM_DIRS: tuple[str, ...] = ("/usr/lib", "/lib", "/lib64", "/usr/lib64", "/etc/ld.so.cache")
"""Besides the interpreter's prefix, what the allowlist root shows (read-only): shared libraries."""
DEVICES: tuple[str, ...] = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_PREFIX = "relayrl-sandbox-"
_counter = itertools.count()

_BOOT = Path(__file__).with_name("sandbox_boot.py")
"""The sandbox's first process, a program of its own (read and linted as code)."""


@dataclass
class SandboxResult:
    returncode: int | None  # None: killed at the time limit
    stdout: str
    stderr: str
    timed_out: bool
    isolation: str  # namespaces | rlimits (see the module docstring)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def level(self) -> int:
        return LEVELS[self.isolation]


@dataclass
class Running:
    """A sandbox started by ``start_sandboxed``; ``finish`` waits (or kills) and cleans up."""

    proc: subprocess.Popen
    root: Path
    out: IO[bytes]
    err: IO[bytes]
    level: int
    output_limit: int

    def finish(self, timeout_s: float) -> SandboxResult:
        """Wait up to ``timeout_s`` for the program, then kill everything it started; remove its files."""
        try:
            timed_out = _wait_or_kill(self.proc, timeout_s, self.root / "init.pid")
            return SandboxResult(
                None if timed_out else self.proc.returncode,
                _read(self.out, self.output_limit),
                _read(self.err, self.output_limit),
                timed_out,
                _name(self.level),
            )
        finally:
            self.out.close()
            self.err.close()
            shutil.rmtree(self.root, ignore_errors=True)


def run_sandboxed(code: str, timeout_s: float = 5.0, **options: Any) -> SandboxResult:
    """Run ``code`` as ``main.py`` to its end or ``timeout_s``; ``options`` as ``start_sandboxed``'s."""
    return start_sandboxed(code, timeout_s=timeout_s, **options).finish(timeout_s)


def start_sandboxed(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    output_limit: int = 64 * 1024,
    isolation: str = "auto",
    files: dict[str, str] | None = None,
    max_procs: int = 32,
    disk_mb: int = 16,
    fds: dict[int, int] | None = None,
) -> Running:
    """Start ``code`` as ``main.py`` and return at once; ``fds`` (target -> fd) are passed to the program.

    ``isolation``: one of ``MODES``. ``output_limit`` bytes of stdout and stderr are kept, and at most that
    much may be written to any file. ``max_procs``: RLIMIT_NPROC of the sandbox's uid. ``disk_mb``: the
    size of the program's tmpfs working dir at level 2.
    """
    return _start(
        resolve_isolation(isolation),
        code,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        output_limit=output_limit,
        files=files or {},
        max_procs=max_procs,
        disk_mb=disk_mb,
        fds=fds or {},
    )


def _start(
    level: int,
    code: str,
    *,
    timeout_s: float,
    memory_mb: int,
    output_limit: int,
    files: dict[str, str],
    max_procs: int,
    disk_mb: int,
    fds: dict[int, int],
) -> Running:
    _sweep_stale()
    root = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
    uid = sandbox_uid()
    box = _prepare(root, code, files, uid)
    args = {
        "level": level,
        "mem": memory_mb * 2**20,
        "cpu": math.ceil(timeout_s) + 1,
        "fsize": output_limit,
        "nproc": max_procs,
        "uid": uid,
        "box": str(box),
        "main": str(box / "main.py"),
        "disk_mb": disk_mb,
        "newroot": str(root / "root"),
        "init_pid": str(root / "init.pid"),
        "parent": os.getpid(),
        "fds": {str(t): fd for t, fd in fds.items()},
        "drop": level == 1 and _can_drop(),
        **_root_plan(),
    }
    (root / "root").mkdir()
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 - Running.finish closes them
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(_BOOT), json.dumps(args)],
        cwd=box,
        env=_env(box),
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        pass_fds=tuple(fds.values()),
        start_new_session=True,
    )
    return Running(proc, root, out, err, level, output_limit)


def sandbox_uid() -> int:
    """A uid for one sandbox: distinct between the sandboxes of one process, and between processes
    unless their pids collide modulo ``UID_SPAN // 64``; never a uid the host's users have."""
    return UID_BASE + (os.getpid() * 64 + next(_counter) % 64) % UID_SPAN


def resolve_isolation(mode: str) -> int:
    """The level ``mode`` gives on this host; ``auto`` without full isolation fails closed, in one line."""
    if mode not in MODES:
        raise ValueError(f"sandbox={mode!r} is not a sandbox mode; use one of {', '.join(MODES)}")
    if mode == "rlimits":
        return LEVELS["rlimits"]
    if not namespaces_available():
        raise ValueError(
            f"reward.sandbox=auto needs full isolation for code_exec, which this host lacks "
            f"({namespaces_missing() or 'unshare(2) failed'}); run the reward workers as root on "
            "a host that allows unshare(2), or set reward.sandbox=rlimits to accept weaker "
            "isolation knowingly (docs/rewards.md)"
        )
    return LEVELS["namespaces"]


def namespaces_missing() -> str | None:
    """Why level 2 is unavailable here (one phrase), or None when it may be (``namespaces_available`` probes)."""
    if sys.platform != "linux":
        return "not Linux"
    if os.uname().machine not in ("x86_64", "aarch64"):
        return f"no pivot_root syscall number for {os.uname().machine}"
    if os.geteuid() != 0:
        return "not root: dropping to a sandbox uid and building its root need it"
    return None


@functools.cache
def namespaces_available() -> bool:
    """Level 2 works on this host: checked once per process by running a program under it."""
    if namespaces_missing() is not None:
        return False
    try:
        probe = _probe()
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.ok and probe.stdout.split() == ["ok", "/"]


def _probe() -> SandboxResult:
    """A tiny program at level 2 that sees its own uid and a root with nothing but the allowlist."""
    code = (
        f"import os; print('ok' if os.getuid() >= {UID_BASE} else 'root', "
        "'/' if os.listdir('/tmp') == ['box'] and not os.path.exists('/root/.bashrc') else 'leak')"
    )
    return _start(
        LEVELS["namespaces"],
        code,
        timeout_s=30.0,
        memory_mb=512,
        output_limit=2**16,
        files={},
        max_procs=8,
        disk_mb=1,
        fds={},
    ).finish(30.0)


def _sweep_stale() -> None:
    """Remove the staging dirs of sandboxes whose process died (a reward worker killed mid-call)."""
    tmp = Path(tempfile.gettempdir())
    for path in tmp.glob(f"{_PREFIX}*-*"):
        pid = path.name[len(_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _prepare(root: Path, code: str, files: dict[str, str], uid: int) -> Path:
    """``root/box``: the program's files, owned by the sandbox uid when we can give them away."""
    box = root / "box"
    box.mkdir()
    for name, text in {**files, "main.py": code}.items():
        (box / name).write_text(text)
    if os.geteuid() == 0:
        for path in (root, box, *box.iterdir()):
            os.chown(path, uid, uid)
        os.chmod(root, 0o711)
    return box


@functools.cache
def _can_drop() -> bool:
    """Level 1 drops to the sandbox uid only as root, and only where another uid can run the interpreter
    (every directory down to its stdlib searchable by others), else the program could not import."""
    if os.geteuid() != 0:
        return False
    stdlib = Path(os.__file__).resolve().parent
    return all(p.stat().st_mode & 0o001 for p in (stdlib, *stdlib.parents)) and bool(stdlib.stat().st_mode & 0o004)


@functools.cache
def _root_plan() -> dict:
    """What the allowlist root holds: the interpreter (its prefix bound, its site-packages masked), the
    system library dirs (symlinks such as ``/lib -> usr/lib`` recreated), and a few devices."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if not exe.startswith(prefix + os.sep):
        prefix = os.path.dirname(os.path.dirname(exe))
    links, binds = [], [prefix]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.exists(path) and not any(path == b or path.startswith(b + "/") for b in binds):
            binds.append(path)
    masks = sorted(str(p) for p in Path(prefix, "lib").glob("python3*/site-packages"))
    return {
        "python": exe,
        "binds": binds,
        "links": links,
        "masks": masks,
        "devices": [d for d in DEVICES if os.path.exists(d)],
    }


def _env(box: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(box), "LANG": "C.UTF-8", "TMPDIR": str(box)}


def _name(level: int) -> str:
    return next(name for name, value in LEVELS.items() if value == level)


def _wait_or_kill(proc: subprocess.Popen, timeout_s: float, init_pid: Path) -> bool:
    """Wait up to ``timeout_s``, then SIGKILL the process group; at level 2 also wait until the pid
    namespace's init is gone (the kernel has then killed everything in the namespace). True: timed out."""
    try:
        proc.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # also reaps anything the code left running in the group
    proc.wait()
    if init_pid.exists():
        _wait_gone(init_pid.read_text().split())
    return timed_out


def _wait_gone(pid_and_start: list[str]) -> None:
    """Wait until the pid namespace's init (orphaned when the boot process was killed, and then killed
    by its PDEATHSIG) has exited. An init becomes a zombie only after every process of its namespace
    is dead, so a zombie counts as gone; the start time tells the init from a later process of that pid."""
    if len(pid_and_start) != 2:
        return
    pid, start = pid_and_start
    while _stat(int(pid))[:1] == [start] and _stat(int(pid))[1:] != ["Z"]:
        time.sleep(0.005)


def _stat(pid: int) -> list[str]:
    """``[start time, state]`` of ``pid`` from /proc, or [] when there is no such process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [fields[19], fields[0]]


def _read(f: IO[bytes], limit: int) -> str:
    f.seek(0)
    return f.read(limit).decode("utf-8", errors="replace")
