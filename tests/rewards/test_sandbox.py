"""The code sandbox: time limit, memory, files, network, processes; each with a control that shows the
thing blocked would otherwise have happened. No test compares a duration with a number."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from relayrl.rewards import sandbox
from relayrl.rewards.builtin import CodeExec, extract_code
from relayrl.rewards.sandbox import UID_BASE, namespaces_available, resolve_isolation, run_sandboxed, start_sandboxed

NS = pytest.mark.skipif(os.geteuid() != 0, reason="full isolation needs root (test_root_has_full_isolation)")
LEVELS = ["rlimits", pytest.param("auto", marks=NS)]


@NS
def test_root_has_full_isolation():
    """Run as root (as CI is), the full-isolation tests run instead of skipping: a root host without
    working namespaces fails here, where ``sandbox=auto`` would refuse to score code."""
    assert namespaces_available(), sandbox.namespaces_missing() or "unshare(2) failed"


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
    sleeper = (
        "import os, sys, time; print('sleeper started', flush=True); os.write(int(sys.argv[1]), b'x'); time.sleep(600)"
    )
    return (
        f"import os\nr, w = os.pipe()\nos.set_inheritable(w, True)\nif os.fork() == 0:\n    os.setsid()\n"
        f"    if os.fork() == 0:\n        os.execv(os.readlink('/proc/self/exe'), "
        f"['python', '-c', {sleeper!r}, str(w), '{token}'])\n    os._exit(0)\n"
        f"os.wait()\nos.read(r, 1)\n{then}\n"
    )


@NS
@pytest.mark.parametrize("then", ["while True: pass", "print('exit')"])
def test_setsid_children_die_with_the_namespace(then):
    """Killed at the time limit, or exiting normally: no process of the program survives the return."""
    token = uuid.uuid4().hex
    loops = then != "print('exit')"
    result = run_sandboxed(
        _detached_sleeper(token, then),
        timeout_s=2.0 if loops else 30.0,  # the exiting one
        isolation="auto",
    )  # must never time out

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
        server.accept()[0].close()  # the control's connection arrived
        result = run_sandboxed(code, isolation=isolation)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # the sandboxed program's never did
            server.accept()
    assert control.stdout == "connected\n"
    assert result.returncode != 0 and "connected" not in result.stdout
    assert ("PermissionError" if isolation == "rlimits" else "OSError") in result.stderr


@NS
def test_writes_outside_the_temp_dir_fail(tmp_path):
    """The program writes its own dir; the rest is read-only, and the trainer's files are not there."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    targets = [str(shared / "x"), "/usr/x", "/etc/x", "/tmp/x", "/root/x", "/x", os.path.join(os.getcwd(), "x")]
    code = (
        "import os\nopen('mine', 'w').write('ok')\nprint(open('mine').read())\n"
        f"for p in {targets!r}:\n    try:\n        open(p, 'w').write('x'); print('wrote', p)\n"
        "    except OSError as e:\n        print('blocked', p)\n"
        f"print('visible' if os.path.exists({str(tmp_path)!r}) else 'hidden')\nprint(os.getuid())"
    )
    result = run_sandboxed(code, isolation="auto")
    assert result.ok and result.isolation == "namespaces" and result.level == 2
    lines = result.stdout.splitlines()
    assert lines[0] == "ok" and lines[1:-2] == [f"blocked {p}" for p in targets]
    assert lines[-2] == "hidden" and int(lines[-1]) >= UID_BASE
    assert not (shared / "x").exists() and not Path(os.getcwd(), "x").exists()


@NS
def test_the_root_is_an_allowlist():
    """Only the interpreter, system libraries, four devices, /proc and the working dir exist: no venv,
    no dataset, no repository, no site-packages, no /home; the working dir is a capped tmpfs."""
    venv_site = next(p for p in sys.path if p.endswith("site-packages"))
    code = (
        "import os, sys\n"
        f"print(sorted(os.listdir('/dev')), os.listdir('/tmp'), os.path.exists({venv_site!r}),\n"
        f"      os.path.exists({os.getcwd()!r}), os.path.exists('/home'), os.path.exists('/work'))\n"
        "site = [p for p in os.listdir(sys.prefix + '/lib') if p.startswith('python3')]\n"
        "print(os.listdir(f'{sys.prefix}/lib/{site[0]}/site-packages'))\n"
        "try:\n    open('big', 'wb').write(b'x' * (3 << 20)); print('wrote 3 MiB')\n"
        "except OSError as e:\n    print('full', e.errno)\n"
    )
    result = run_sandboxed(code, isolation="auto", disk_mb=2, output_limit=8 << 20)
    assert result.ok, result.stderr
    assert result.stdout.splitlines() == [
        "['null', 'random', 'urandom', 'zero'] ['box'] False False False False",
        "[]",
        "full 28",
    ]
    control = subprocess.run(
        [sys.executable, "-c", f"import os; print(os.path.exists({venv_site!r}))"], capture_output=True, text=True
    )
    assert control.stdout == "True\n"


@pytest.mark.parametrize("isolation", LEVELS)
def test_descriptors_are_passed_to_the_program(isolation):
    read, write = os.pipe()
    running = start_sandboxed("import os; os.write(7, b'to the parent')", isolation=isolation, fds={7: write})
    os.close(write)
    result = running.finish(10.0)
    with os.fdopen(read, "rb") as f:
        assert result.ok and f.read() == b"to the parent"


@NS
def test_a_killed_worker_leaves_no_sandbox_and_no_files():
    """The reward worker that started a sandbox is SIGKILLed mid-call (as the pool does on a timeout):
    the sandbox's processes die with it, and the next sandbox sweeps its staging dir."""
    token = uuid.uuid4().hex
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "from relayrl.rewards.sandbox import run_sandboxed\n"
                f"run_sandboxed({_detached_sleeper(token, 'import time; time.sleep(600)')!r}, timeout_s=600)"
            ),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        while set(_procs_with(token)) <= {worker.pid}:  # the worker's own command line holds it too
            assert worker.poll() is None, "the worker died before its sandbox started"
            time.sleep(0.1)
        staged = list(Path(tempfile.gettempdir()).glob(f"relayrl-sandbox-{worker.pid}-*"))
        assert staged
    finally:
        worker.kill()
        worker.wait()
    _wait_until(lambda: not _procs_with(token))
    run_sandboxed("pass")
    assert not any(p.exists() for p in staged)


def _wait_until(done, limit_s: float = 120.0) -> None:
    """Poll ``done`` (a hang guard, not a timing assertion: the kernel kills asynchronously)."""
    deadline = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline, "still there"
        time.sleep(0.05)


@NS
def test_fork_bomb_is_limited():
    code = (
        "import os, time\nn = 0\nfor _ in range(1000):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(600)\n        os._exit(0)\n"
        "    n += 1\nprint(n)"
    )
    result = run_sandboxed(code, isolation="auto", max_procs=16)
    assert result.ok and 1 <= int(result.stdout) < 16


@pytest.mark.parametrize("isolation", LEVELS)
def test_memory_limit_and_temp_dir(isolation):
    big = run_sandboxed("x = bytearray(1024 ** 3)", memory_mb=256, isolation=isolation)
    assert big.returncode == 1 and "MemoryError" in big.stderr
    flood = run_sandboxed("open('f', 'w').write('x' * 10**6)", output_limit=1000, isolation=isolation)
    assert flood.returncode == 1 and "File too large" in flood.stderr


def test_modes_and_failing_closed(monkeypatch):
    assert resolve_isolation("rlimits") == 1
    with pytest.raises(ValueError, match="sandbox='off' is not a sandbox mode"):
        resolve_isolation("off")
    monkeypatch.setattr(sandbox, "namespaces_available", lambda: False)
    with pytest.raises(ValueError, match=r"^reward.sandbox=auto needs full isolation .*set reward.sandbox=rlimits"):
        resolve_isolation("auto")
    with pytest.raises(ValueError, match=r"^reward.sandbox=auto needs full isolation"):
        CodeExec()
    assert CodeExec(sandbox="rlimits").level == 1


@NS
def test_code_exec_reward_and_its_metric():
    good = "Here you go:\n```python\ndef f(x):\n    return 2 * x\n```"
    completions = [good, "def f(x):\n    return x + 1", "```python\ndef f(x):\n    while True: pass\n```", good]
    tests = ["assert f(2) == 4 and f(5) == 10"] * 3 + [None]
    reward = CodeExec(timeout_s=15.0)  # room for a loaded box: the honest program must never time out
    assert reward([""] * 4, completions, tests=tests) == [1.0, 0.0, 0.0, None]
    assert reward.metrics() == {"reward/sandbox_isolation": 2.0}
    assert CodeExec(sandbox="rlimits").metrics() == {"reward/sandbox_isolation": 1.0}
    assert extract_code("a\n```py\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
