"""The code sandbox: time limit, memory, files, network, processes; each with a control that shows the
thing blocked would otherwise have happened. No test compares a duration with a number."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from relayrl.rewards.builtin import CodeExec, extract_code
from relayrl.rewards.sandbox import namespaces_available, resolve_isolation, run_sandboxed

NS = pytest.mark.skipif(not namespaces_available(), reason="no root / unshare(2): level 2 unavailable here")
LEVELS = ["rlimits", pytest.param("required", marks=NS)]


def _procs_with(token: str) -> list[int]:
    """Pids of this host whose command line contains ``token``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def _detached_sleeper(token: str, then: str) -> str:
    """A program that double-forks a ``setsid`` sleeper (``token`` in its argv), waits until the sleeper
    said so from its exec'd process (a pipe: no race with the program's exit or the exec), then ``then``."""
    sleeper = ("import os, sys, time; print('sleeper started', flush=True); "
               "os.write(int(sys.argv[1]), b'x'); time.sleep(600)")
    return (f"import os\nr, w = os.pipe()\nos.set_inheritable(w, True)\nif os.fork() == 0:\n    os.setsid()\n"
            f"    if os.fork() == 0:\n        os.execv(os.readlink('/proc/self/exe'), "
            f"['python', '-c', {sleeper!r}, str(w), '{token}'])\n    os._exit(0)\n"
            f"os.wait()\nos.read(r, 1)\n{then}\n")


@NS
@pytest.mark.parametrize("then", ["while True: pass", "print('exit')"])
def test_setsid_children_die_with_the_namespace(then):
    """Killed at the time limit, or exiting normally: no process of the program survives the return."""
    token = uuid.uuid4().hex
    loops = then != "print('exit')"
    result = run_sandboxed(_detached_sleeper(token, then), timeout_s=2.0 if loops else 30.0,   # the exiting one
                           isolation="required")                                              # must never time out

    assert "sleeper started" in result.stdout and result.timed_out == loops
    assert _procs_with(token) == []


def test_setsid_child_escapes_the_rlimits_level():
    """Control for the test above: without a pid namespace the same sleeper outlives the program."""
    token = uuid.uuid4().hex
    result = run_sandboxed(_detached_sleeper(token, "print('exit')"), isolation="rlimits")
    survivors = _procs_with(token)
    for pid in survivors:
        os.kill(pid, 9)
    assert "sleeper started" in result.stdout and survivors


@pytest.mark.parametrize("isolation", LEVELS)
def test_infinite_loop_is_killed_and_reported(isolation):
    code = "while True: pass\nprint('after the loop')"
    result = run_sandboxed(code, timeout_s=1.0, isolation=isolation)
    assert result.timed_out and result.returncode is None and not result.ok
    assert "after the loop" not in result.stdout


def _connect(port: int) -> str:
    return f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5).close()\nprint('connected')"


@pytest.mark.parametrize("isolation", LEVELS)
def test_network_to_a_loopback_server_fails_but_works_unsandboxed(isolation):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(30)
        code = _connect(server.getsockname()[1])
        control = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
        server.accept()[0].close()                     # the control's connection arrived
        result = run_sandboxed(code, isolation=isolation)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):           # the sandboxed program's never did
            server.accept()
    assert control.stdout == "connected\n"
    assert result.returncode != 0 and "connected" not in result.stdout
    assert ("PermissionError" if isolation == "rlimits" else "OSError") in result.stderr


@NS
def test_writes_outside_the_temp_dir_fail(tmp_path):
    """The program writes its own dir; the rest is read-only, and the trainer's files are not visible."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    targets = [str(shared / "x"), "/usr/x", "/etc/x", "/tmp/x", "/root/x", os.path.join(os.getcwd(), "x")]
    code = ("import os\nopen('mine', 'w').write('ok')\nprint(open('mine').read())\n"
            f"for p in {targets!r}:\n    try:\n        open(p, 'w').write('x'); print('wrote', p)\n"
            "    except OSError as e:\n        print('blocked', p)\n"
            f"print('visible' if os.path.exists({str(tmp_path)!r}) else 'hidden')\nprint(os.getuid())")
    result = run_sandboxed(code, isolation="required")
    assert result.ok and result.isolation == "namespaces" and result.level == 2
    lines = result.stdout.splitlines()
    assert lines[0] == "ok" and lines[1:-2] == [f"blocked {p}" for p in targets]
    assert lines[-2:] == ["hidden", "65534"]
    assert not (shared / "x").exists() and not Path(os.getcwd(), "x").exists()


@NS
def test_fork_bomb_is_limited():
    code = ("import os, time\nn = 0\nfor _ in range(1000):\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(600)\n        os._exit(0)\n"
            "    n += 1\nprint(n)")
    result = run_sandboxed(code, isolation="required", max_procs=16)
    assert result.ok and 1 <= int(result.stdout) < 16


@pytest.mark.parametrize("isolation", LEVELS)
def test_memory_limit_and_temp_dir(isolation):
    big = run_sandboxed("x = bytearray(1024 ** 3)", memory_mb=256, isolation=isolation)
    assert big.returncode == 1 and "MemoryError" in big.stderr
    flood = run_sandboxed("open('f', 'w').write('x' * 10**6)", output_limit=1000, isolation=isolation)
    assert flood.returncode == 1 and "File too large" in flood.stderr
    channel = run_sandboxed("import os; os.write(3, b'to the parent')", isolation=isolation)
    assert channel.ok and channel.channel == b"to the parent"


def test_modes_and_fallback_level():
    assert resolve_isolation("rlimits") == 1
    assert resolve_isolation("auto") == (2 if namespaces_available() else 1)
    with pytest.raises(ValueError, match="sandbox='off' is not a sandbox mode"):
        resolve_isolation("off")
    if not namespaces_available():
        with pytest.raises(RuntimeError, match="^sandbox=required, but this host cannot isolate"):
            resolve_isolation("required")


def test_code_exec_reward_and_its_metric():
    good = "Here you go:\n```python\ndef f(x):\n    return 2 * x\n```"
    completions = [good, "def f(x):\n    return x + 1", "```python\ndef f(x):\n    while True: pass\n```", good]
    tests = ["assert f(2) == 4 and f(5) == 10"] * 3 + [None]
    reward = CodeExec(timeout_s=15.0)      # room for a loaded box: the honest program must never time out
    assert reward([""] * 4, completions, tests=tests) == [1.0, 0.0, 0.0, None]
    assert reward.metrics() == {"reward/sandbox_isolation": 2.0 if namespaces_available() else 1.0}
    assert CodeExec(sandbox="rlimits").metrics() == {"reward/sandbox_isolation": 1.0}
    assert extract_code("a\n```py\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
