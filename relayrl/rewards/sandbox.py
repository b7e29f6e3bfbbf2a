"""Run untrusted code (a model's completion) in a subprocess, isolated where the host allows it.

Two isolation levels (``SandboxResult.level``; the scorer logs it as ``reward/sandbox_isolation``):

* **2, namespaces** (needs root and working ``unshare(2)``): the program runs in new mount, pid and
  network namespaces, then a new user namespace, as uid/gid 65534 (nobody) with no capabilities:

  - files: every mount is read-only, except the program's own temp dir (its cwd and HOME, at
    ``/tmp/box``); ``/root``, ``/home``, ``/tmp``, ``/run``, ``/opt``, ... and the top directory of
    the trainer's cwd are covered by empty read-only tmpfs, so datasets and run dirs are not visible;
    the interpreter's prefix is bind-mounted back, read-only, at its own path;
  - network: an empty network namespace (loopback down): no connection works, not even to this host;
  - processes: a fresh pid namespace whose init is the program itself; when it exits, or its parent
    is killed at the time limit (``PR_SET_PDEATHSIG``), the kernel kills every process in the
    namespace, including children that called ``setsid`` or double-forked. ``run_sandboxed``
    returns only after that init is gone. RLIMIT_NPROC caps the processes of uid 65534.
* **1, rlimits** (any host): the program runs as this user in its own session (the process group is
  killed at the time limit; a child that calls ``setsid`` escapes it), with no process limit
  (RLIMIT_NPROC would count the trainer's own processes) and an in-process ``socket`` guard that
  stops accidents, not a determined program. The filesystem is as visible as to the trainer.
  A one-line warning says so, once per process.

Both levels: RLIMIT_AS (``memory_mb``: a larger allocation raises MemoryError), RLIMIT_CPU, RLIMIT_FSIZE
(``output_limit``: every file written, stdout/stderr included), no core dumps, ``python -I``, a minimal
environment, stdin closed, a wall-clock ``timeout_s`` after which everything is SIGKILLed.

The program may write to fd 3, a file the parent opened before the program started (the channel
``rewards.harness`` reads test results from); ``SandboxResult.channel`` holds what was written.
"""

from __future__ import annotations

import functools
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

MODES: tuple[str, ...] = ("auto", "required", "rlimits")
"""``auto``: namespaces where available, else rlimits; ``required``: namespaces or an error; ``rlimits``."""
LEVELS: dict[str, int] = {"namespaces": 2, "rlimits": 1}
"""The number ``reward/sandbox_isolation`` logs for each isolation level."""
NOBODY = 65534
CHANNEL_FD = 3
HIDDEN: tuple[str, ...] = ("/root", "/home", "/tmp", "/var/tmp", "/mnt", "/media", "/srv", "/opt", "/run",
                           "/dev/shm", "/data", "/work")
"""Directories covered by an empty tmpfs at level 2 (those that exist), plus the top of the trainer's cwd."""

# The boot script runs as the sandbox's first process. Level 1: set rlimits, guard sockets, run main.py.
# Level 2: unshare pid/net, fork the namespace's init, which unshares mounts, builds the read-only view, drops to
# nobody, enters a new user namespace and execs the interpreter on main.py; the boot process waits for
# it (so its parent's SIGKILL reaches the init through PDEATHSIG) and exits with its status.
_BOOT = r"""
import ctypes, json, os, resource, select, signal, sys
a = json.loads(sys.argv[1])
os.dup2(a["channel"], 3)
if a["channel"] != 3:
    os.close(a["channel"])

def limits(nproc):
    pairs = [(resource.RLIMIT_AS, a["mem"]), (resource.RLIMIT_CPU, a["cpu"]), (resource.RLIMIT_FSIZE, a["fsize"]),
             (resource.RLIMIT_CORE, 0)] + ([(resource.RLIMIT_NPROC, nproc)] if nproc else [])
    for limit, value in pairs:
        resource.setrlimit(limit, (value, value))

if a["level"] == 1:
    limits(0)
    import runpy, socket
    def _no_network(*args, **kwargs):
        raise PermissionError("network access is disabled in the relayrl sandbox")
    class _NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            _no_network()
    socket.socket = _NoSocket
    socket.create_connection = socket.getaddrinfo = socket.socketpair = socket.fromfd = _no_network
    sys.argv = [a["main"]]
    del a, limits, ctypes, json, resource, select, signal
    runpy.run_path(sys.argv[0], run_name="__main__")
    sys.exit(0)

libc = ctypes.CDLL(None, use_errno=True)
NS, USER, PID, NET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18

def check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")

def mount(src, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")

def mount_points():
    for line in open("/proc/self/mountinfo"):
        point = line.split()[4]
        yield point.encode().decode("unicode_escape") if "\\" in point else point

def read_only_view():
    check(libc.unshare(NS), "unshare mount")
    mount(None, "/", None, REC | PRIVATE)
    mount("proc", "/proc", "proc", NOSUID | NODEV | NOEXEC)
    box, py = os.open(a["box"], os.O_PATH), os.open(a["prefix"], os.O_PATH)
    for d in a["hide"]:
        mount("tmpfs", d, "tmpfs", NOSUID | NODEV, "size=64k,mode=755")
    for target, fd in (("/tmp/box", box), (a["prefix"], py)):   # the interpreter keeps its own path
        os.makedirs(target, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", target, None, BIND | REC)
        os.close(fd)
    for point in mount_points():
        if point == "/proc" or point.startswith("/proc/"):
            continue
        flags = REMOUNT | BIND | NOSUID | NODEV | (0 if point == "/tmp/box" else RDONLY)
        try:
            mount(None, point, None, flags)
        except OSError:
            if point in ("/", "/tmp", "/tmp/box", a["prefix"]):
                raise

def become_nobody():
    os.setgroups([])
    os.setgid(a["uid"])
    os.setuid(a["uid"])
    libc.prctl(4, 1, 0, 0, 0)                      # PR_SET_DUMPABLE: own /proc/self/*_map again
    check(libc.unshare(USER), "unshare user")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{a['uid']} {a['uid']} 1"),
                       ("gid_map", f"{a['uid']} {a['uid']} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)

def init(alive):
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)         # PR_SET_PDEATHSIG (cleared by setuid: set again below)
    read_only_view()
    os.chdir("/tmp/box")
    become_nobody()
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    if select.select([alive], [], [], 0)[0]:       # the boot process died before PDEATHSIG was set again
        os._exit(137)
    os.close(alive)
    limits(a["nproc"])
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp/box", "TMPDIR": "/tmp/box", "LANG": "C.UTF-8"}
    os.execve(a["python"], ["python", "-I", "-S", "main.py"], env)

check(libc.unshare(PID | NET), "unshare pid/net")     # the mount namespace is the init's own (below)
alive_r, alive_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(alive_w)
    try:
        init(alive_r)
    except BaseException as exc:
        os.write(2, f"relayrl sandbox setup failed: {exc}\n".encode())
        os._exit(125)
os.close(alive_r)
with open(a["init_pid"], "w") as f:                # pid and start time: the parent waits for this init
    f.write(f"{pid} {open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[19]}")
status = os.waitpid(pid, 0)[1]
os.truncate(a["init_pid"], 0)                      # reaped: the pid may be reused, nothing to wait for
sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
"""


@dataclass
class SandboxResult:
    returncode: int | None               # None: killed at the time limit
    stdout: str
    stderr: str
    timed_out: bool
    isolation: str                       # namespaces | rlimits (see the module docstring)
    channel: bytes = b""                 # what the program wrote to fd 3

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def level(self) -> int:
        return LEVELS[self.isolation]


def run_sandboxed(code: str, timeout_s: float = 5.0, memory_mb: int = 512, output_limit: int = 64 * 1024,
                  isolation: str = "auto", files: dict[str, str] | None = None,
                  max_procs: int = 32) -> SandboxResult:
    """Run ``code`` as ``main.py`` (next to ``files``, name -> text) under the limits in the module docstring.

    ``isolation``: one of ``MODES``. ``output_limit`` bytes of stdout, stderr and the channel are kept,
    and at most that much may be written to any file. ``max_procs``: RLIMIT_NPROC at level 2.
    """
    level = resolve_isolation(isolation)
    with tempfile.TemporaryDirectory(prefix="relayrl-sandbox-") as root:
        box = _prepare(Path(root), code, files or {}, level)
        args = {"level": level, "mem": memory_mb * 2**20, "cpu": math.ceil(timeout_s) + 1, "fsize": output_limit,
                "nproc": max_procs, "uid": NOBODY, "box": str(box), "main": str(box / "main.py"),
                "hide": _hidden(), "init_pid": f"{root}/init.pid", **_interpreter()}
        with open(f"{root}/stdout", "wb+") as out, open(f"{root}/stderr", "wb+") as err, \
                open(f"{root}/channel", "wb+") as channel:
            args["channel"] = channel.fileno()
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _BOOT, _json(args)], cwd=box,
                                    env=_env(box), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    pass_fds=(channel.fileno(),), start_new_session=True)
            timed_out = _wait_or_kill(proc, timeout_s, Path(root) / "init.pid")
            return SandboxResult(None if timed_out else proc.returncode, _read(out, output_limit),
                                 _read(err, output_limit), timed_out, _name(level),
                                 _read(channel, output_limit, text=False))


def resolve_isolation(mode: str) -> int:
    """The level ``mode`` gives on this host; ``required`` without namespaces fails closed, in one line."""
    if mode not in MODES:
        raise ValueError(f"sandbox={mode!r} is not a sandbox mode; use one of {', '.join(MODES)}")
    if mode == "rlimits":
        return LEVELS["rlimits"]
    if namespaces_available():
        return LEVELS["namespaces"]
    if mode == "required":
        raise RuntimeError(f"sandbox=required, but this host cannot isolate programs ({namespaces_missing()}); "
                           "run the trainer as root on a host that allows unshare(2), or set sandbox=auto")
    _warn_rlimits_only()
    return LEVELS["rlimits"]


def namespaces_missing() -> str | None:
    """Why level 2 is unavailable here (one phrase), or None when it is available."""
    if sys.platform != "linux":
        return "not Linux"
    if os.geteuid() != 0:
        return "not root: dropping to uid 65534 and read-only mounts need it"
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
    return probe.ok and probe.stdout == "65534\n"


def _probe() -> SandboxResult:
    """A tiny program at level 2 (bypasses ``resolve_isolation``, which asks ``namespaces_available``)."""
    with tempfile.TemporaryDirectory(prefix="relayrl-sandbox-") as root:
        box = _prepare(Path(root), "import os; print(os.getuid())", {}, 2)
        args = {"level": 2, "mem": 512 * 2**20, "cpu": 10, "fsize": 2**20, "nproc": 8, "uid": NOBODY,
                "box": str(box), "main": str(box / "main.py"), "hide": _hidden(), "init_pid": f"{root}/init.pid",
                "channel": 0, **_interpreter()}
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", _BOOT, _json(args)], cwd=box, env=_env(box),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30, start_new_session=True)
        return SandboxResult(proc.returncode, proc.stdout.decode(), proc.stderr.decode(), False, "namespaces")


@functools.cache
def _warn_rlimits_only() -> None:
    print(f"relayrl sandbox: no namespace isolation ({namespaces_missing() or 'unshare(2) failed'}); "
          "programs run as this user with rlimits only: filesystem visible, network guard bypassable, "
          "no process limit (reward/sandbox_isolation=1)", file=sys.stderr)


def _prepare(root: Path, code: str, files: dict[str, str], level: int) -> Path:
    """``root/box``: the program's directory with ``main.py`` and ``files``, owned by nobody at level 2."""
    box = root / "box"
    box.mkdir()
    for name, text in {**files, "main.py": code}.items():
        (box / name).write_text(text)
    if level == LEVELS["namespaces"]:
        for path in (box, *box.iterdir()):
            os.chown(path, NOBODY, NOBODY)
    return box


@functools.cache
def _interpreter() -> dict[str, str]:
    """The real interpreter and the directory it needs (bind-mounted back at level 2 if it is hidden)."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if not exe.startswith(prefix + os.sep):
        prefix = os.path.dirname(os.path.dirname(exe))
    return {"prefix": prefix, "python": exe}


def _hidden() -> list[str]:
    top = "/" + os.getcwd().strip("/").split("/")[0]
    system = {"/", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/proc", "/sys", "/dev", "/var"}
    dirs = list(HIDDEN) + ([top] if top not in system and top not in HIDDEN else [])
    return [d for d in dirs if os.path.isdir(d) and not os.path.islink(d)]


def _env(box: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(box), "LANG": "C.UTF-8",
            "TMPDIR": str(box)}


def _json(args: dict) -> str:
    import json

    return json.dumps(args)


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
    try:
        os.killpg(proc.pid, signal.SIGKILL)       # also reaps anything the code left running in the group
    except (ProcessLookupError, PermissionError):
        pass
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


def _read(f, limit: int, text: bool = True) -> str | bytes:
    f.seek(0)
    data = f.read(limit)
    return data.decode("utf-8", errors="replace") if text else data
