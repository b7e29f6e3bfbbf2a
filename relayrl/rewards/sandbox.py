"""Run untrusted code (a model's completion) in a subprocess with time, memory and network limits.

What ``run_sandboxed`` enforces, and how:

* **time**: wall-clock ``timeout_s``; on expiry the whole process group is sent SIGKILL (the child runs
  in its own session, so processes it forked go too). RLIMIT_CPU backs it up inside the child.
* **memory**: RLIMIT_AS (address space) of ``memory_mb``: a larger allocation fails with MemoryError.
* **files**: a fresh temporary directory is the working directory and HOME, deleted afterwards;
  RLIMIT_FSIZE caps every file written (stdout/stderr are files there too, so output is bounded);
  no core dumps.
* **network**: with ``network="namespace"`` (the default when ``unshare -n`` or, unprivileged,
  ``unshare -rn`` works on this host) the child runs in a new, empty network namespace: no interface
  but a down loopback, so every connection fails, to the internet and to this host's localhost alike.
  Where namespaces are unavailable, ``network="guard"`` replaces ``socket.socket`` and friends in the
  child before the code runs. That is a guard against accidents, **not a security boundary**: code that
  imports ``_socket`` directly or runs a subprocess gets past it.
* **environment**: ``python -I`` (no PYTHONPATH, no user site), a minimal environment, stdin closed.

Not isolated: the filesystem outside the temp dir is readable (and writable where this user may
write), and the process count is not limited. Run the trainer in a container for hostile code.
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
from dataclasses import dataclass
from pathlib import Path

_BOOT = r"""
import resource, runpy, sys
mem, cpu, fsize, guard, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
for limit, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, fsize),
                     (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (value, value))
if guard:
    import socket
    def _no_network(*args, **kwargs):
        raise PermissionError("network access is disabled in the relayrl sandbox")
    class _NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            _no_network()
    socket.socket = _NoSocket
    socket.create_connection = socket.getaddrinfo = socket.socketpair = socket.fromfd = _no_network
del resource, mem, cpu, fsize, guard
sys.argv = [path]
runpy.run_path(path, run_name="__main__")
"""


@dataclass
class SandboxResult:
    returncode: int | None               # None: killed at the time limit
    stdout: str
    stderr: str
    timed_out: bool
    network: str                         # how network was blocked: namespace | guard

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@functools.cache
def network_namespace_prefix() -> tuple[str, ...] | None:
    """``unshare`` arguments that put a command in a new network namespace on this host, or None."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for flags in (("-n",), ("-r", "-n")):     # root; then an unprivileged user namespace
        try:
            if subprocess.run([unshare, *flags, "true"], capture_output=True, timeout=10).returncode == 0:
                return (unshare, *flags)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None


def run_sandboxed(code: str, timeout_s: float = 5.0, memory_mb: int = 512, output_limit: int = 64 * 1024,
                  network: str = "auto") -> SandboxResult:
    """Run ``code`` as a Python script under the limits in the module docstring.

    ``network``: auto (namespace if available, else guard) | namespace (error if unavailable) | guard.
    ``output_limit`` bytes of each of stdout/stderr are kept (and at most that much may be written per file).
    """
    prefix, mode = _network_mode(network)
    with tempfile.TemporaryDirectory(prefix="relayrl-sandbox-") as tmp:
        script = Path(tmp) / "main.py"
        script.write_text(code)
        args = [*prefix, sys.executable, "-I", "-c", _BOOT, str(memory_mb * 2**20),
                str(math.ceil(timeout_s) + 1), str(output_limit), "1" if mode == "guard" else "0", str(script)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "LANG": "C.UTF-8", "TMPDIR": tmp}
        with open(Path(tmp) / ".stdout", "wb+") as out, open(Path(tmp) / ".stderr", "wb+") as err:
            proc = subprocess.Popen(args, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True)
            timed_out = _wait_or_kill(proc, timeout_s)
            return SandboxResult(None if timed_out else proc.returncode, _read(out, output_limit),
                                 _read(err, output_limit), timed_out, mode)


def _network_mode(network: str) -> tuple[tuple[str, ...], str]:
    if network not in ("auto", "namespace", "guard"):
        raise ValueError(f"network={network!r} is not a sandbox mode; use auto, namespace or guard")
    prefix = network_namespace_prefix() if network != "guard" else None
    if network == "namespace" and prefix is None:
        raise RuntimeError("network='namespace' needs `unshare -n` (or `unshare -rn`) to work on this host; "
                           "use network='auto' to fall back to the in-process socket guard")
    return (prefix, "namespace") if prefix else ((), "guard")


def _wait_or_kill(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait up to ``timeout_s``; then SIGKILL the child's process group. True when it had to be killed."""
    try:
        proc.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    try:
        os.killpg(proc.pid, signal.SIGKILL)       # also reaps anything the code left running in the background
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    return timed_out


def _read(f, limit: int) -> str:
    f.seek(0)
    return f.read(limit).decode("utf-8", errors="replace")
