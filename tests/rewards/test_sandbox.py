"""The code sandbox: killed at the time limit (children too), memory cap, no network, temp dir."""

from __future__ import annotations

import os
import socket
import time

import pytest

from relayrl.rewards.builtin import code_exec, extract_code
from relayrl.rewards.sandbox import network_namespace_prefix, run_sandboxed

MODES = ["guard", pytest.param("namespace", marks=pytest.mark.skipif(
    network_namespace_prefix() is None, reason="unshare -n / -rn not available on this host"))]


def test_infinite_loop_is_killed_with_its_children():
    code = "import subprocess\np = subprocess.Popen(['sleep', '60'])\nprint(p.pid, flush=True)\nwhile True: pass"
    t0 = time.perf_counter()
    result = run_sandboxed(code, timeout_s=1.0)
    elapsed = time.perf_counter() - t0
    assert result.timed_out and result.returncode is None and not result.ok
    assert 1.0 <= elapsed < 3.0
    child = int(result.stdout.split()[0])
    time.sleep(0.2)
    assert _state(child) in ("gone", "Z"), "the process group must go down, not only the script"


def _state(pid: int) -> str:
    """'gone', or the state letter from /proc (Z: killed, waiting for init to reap it)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


@pytest.mark.parametrize("mode", MODES)
def test_network_call_to_a_listening_local_socket_fails(mode):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
        control = run_sandboxed(code, network="guard").network   # the probe itself must not connect either
        result = run_sandboxed(code, network=mode)
    assert control == "guard" and result.network == mode
    assert result.returncode != 0 and "connected" not in result.stdout
    assert ("PermissionError" if mode == "guard" else "OSError") in result.stderr


def test_network_is_reachable_without_the_sandbox():
    """Control for the test above: the same connection works from this process."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=2).close()


def test_memory_limit_and_temp_dir():
    big = run_sandboxed("x = bytearray(1024 ** 3)", memory_mb=256)
    assert big.returncode == 1 and "MemoryError" in big.stderr
    where = run_sandboxed("import os; print(os.getcwd()); open('out.txt', 'w').write('hi')")
    cwd = where.stdout.strip()
    assert where.ok and os.path.basename(cwd).startswith("relayrl-sandbox-") and not os.path.exists(cwd)
    flood = run_sandboxed("open('f', 'w').write('x' * 10**6)", output_limit=1000)
    assert flood.returncode == 1 and "File too large" in flood.stderr


def test_code_exec_reward():
    good = "Here you go:\n```python\ndef f(x):\n    return 2 * x\n```"
    completions = [good, "def f(x):\n    return x + 1", "```python\ndef f(x):\n    while True: pass\n```", good]
    tests = ["assert f(2) == 4 and f(5) == 10"] * 3 + [None]
    assert code_exec([""] * 4, completions, tests=tests, timeout_s=1.0) == [1.0, 0.0, 0.0, None]
    assert extract_code("a\n```py\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
