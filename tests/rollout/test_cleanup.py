"""Orphaned shared-memory segments: real segments made by child processes, one killed, one alive.

The children create segments the way vLLM's message queue does (``multiprocessing.shared_memory``), under
a prefix of this test's own so that the cleanup never judges segments of other programs on the host.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from relayrl.rollout.cleanup import SHM_DIR, remove_orphaned_segments

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs /dev/shm")

CHILD = """
import os, sys, time
from multiprocessing import resource_tracker, shared_memory

prefix = sys.argv[1]
mapped = shared_memory.SharedMemory(name=prefix + "mapped", create=True, size=1 << 20)
resource_tracker.unregister(mapped._name, "shared_memory")   # as if killed with its tracker: nothing unlinks it
os.close(mapped._fd)                                          # held by the mapping alone
mapped._fd = -1
fd = os.open("/dev/shm/" + prefix + "opened", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)  # shm_open on Linux
os.ftruncate(fd, 4096)                                        # held by the open fd alone, never mapped
print("ready", flush=True)
time.sleep(600)
"""


def _start(prefix: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, prefix], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _names(prefix: str) -> set[str]:
    return {p.name for p in SHM_DIR.glob(f"{prefix}*")}


def test_segments_of_a_killed_process_go_and_those_of_a_live_one_stay():
    prefix = f"relayrl_test_{uuid.uuid4().hex[:8]}_"
    dead, live = _start(prefix + "dead_"), _start(prefix + "live_")
    try:
        os.kill(dead.pid, signal.SIGKILL)
        dead.wait()
        suffixes = ("mapped", "opened")
        assert _names(prefix) == {f"{prefix}{who}_{s}" for who in ("dead", "live") for s in suffixes}
        result = remove_orphaned_segments(prefixes=(prefix,))
        assert sorted(result.removed) == [f"{prefix}dead_{s}" for s in suffixes]
        assert result.bytes_freed == (1 << 20) + 4096
        assert _names(prefix) == {f"{prefix}live_{s}" for s in suffixes}  # mapped-only and fd-only both held
        assert remove_orphaned_segments(prefixes=(prefix,)).removed == []
    finally:
        for proc in (dead, live):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        for name in _names(prefix):
            Path(SHM_DIR / name).unlink(missing_ok=True)


SEMAPHORE_CHILD = """
import multiprocessing, sys, time
from multiprocessing import process, resource_tracker

process.current_process()._config["semprefix"] = "/" + sys.argv[1]  # multiprocessing's "/mp", made ours
lock = multiprocessing.get_context("spawn").Lock()                  # named, as in a forkserver child
resource_tracker.unregister(lock._semlock.name, "semaphore")          # as if killed with its tracker
print("ready", flush=True)
time.sleep(600)
"""


def test_semaphores_of_a_killed_process_go_and_those_of_a_live_one_stay():
    """A semaphore's creator maps it under glibc's temporary name (``sem.XXXXXX (deleted)``), not its own:
    holders are matched by inode."""
    prefix = f"relayrl_test_{uuid.uuid4().hex[:8]}_"
    procs = {}
    try:
        for who in ("dead", "live"):
            procs[who] = subprocess.Popen(
                [sys.executable, "-c", SEMAPHORE_CHILD, prefix + who], stdout=subprocess.PIPE, text=True
            )
            assert procs[who].stdout.readline().strip() == "ready"
        os.kill(procs["dead"].pid, signal.SIGKILL)
        procs["dead"].wait()
        dead, live = (_names(f"sem.{prefix}{who}") for who in ("dead", "live"))
        assert len(dead) == len(live) == 1
        result = remove_orphaned_segments(prefixes=(f"sem.{prefix}",))
        assert result.removed == list(dead) and result.bytes_freed == 32
        assert _names(f"sem.{prefix}") == live
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for name in _names(f"sem.{prefix}"):
            Path(SHM_DIR / name).unlink(missing_ok=True)


def test_nothing_to_remove_without_candidates(tmp_path):
    (tmp_path / "other_segment").write_bytes(b"x")
    assert remove_orphaned_segments(prefixes=("psm_",), shm_dir=tmp_path).removed == []
    assert (tmp_path / "other_segment").exists()


def test_kill_process_tree_ends_stopped_descendants():
    """A stopped grandchild (a SIGSTOPped EngineCore under its actor) dies with the tree: only SIGKILL
    reaches a stopped process, and ``ray.kill`` of the actor alone would leave it."""
    import signal
    import subprocess
    import sys

    import psutil

    from relayrl.rollout.cleanup import kill_process_tree

    code = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(600)']); print('up', flush=True); time.sleep(600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline().strip() == "up"
    tree = [psutil.Process(parent.pid), *psutil.Process(parent.pid).children(recursive=True)]
    assert len(tree) == 2
    for proc in tree:
        proc.send_signal(signal.SIGSTOP)
    assert kill_process_tree(parent.pid) == 2
    parent.wait(timeout=60)
    _gone, alive = psutil.wait_procs(tree, timeout=60)
    assert alive == []


def test_socket_directories_of_dead_clients_go_and_those_of_live_ones_stay(tmp_path):
    """``relayrl-ipc-<pid>-*``: a dead pid's directory goes with its sockets, a live pid's stays, and so does
    anything else (a file under the prefix, another name, a directory whose name holds no pid)."""
    import socket

    from relayrl.rollout.cleanup import IPC_PREFIX, remove_orphaned_ipc_dirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / f"{IPC_PREFIX}{dead.pid}-abc"
    kept = tmp_path / f"{IPC_PREFIX}{os.getpid()}-def"
    for path in (gone, kept, tmp_path / f"{IPC_PREFIX}x-1", tmp_path / "other-1"):
        path.mkdir()
    (tmp_path / f"{IPC_PREFIX}{dead.pid}-file").write_text("")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(gone / "0b1c"))  # as vLLM binds one: the file outlives the socket
    assert remove_orphaned_ipc_dirs(tmp_path) == [gone.name]
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {kept.name, f"{IPC_PREFIX}x-1", "other-1", f"{IPC_PREFIX}{dead.pid}-file"}


def test_an_engine_socket_directory_is_private_and_too_long_a_path_keeps_vllms_default(tmp_path, monkeypatch):
    """``engine_ipc_dir``: a 0700 directory named for this process; under a temp dir so deep that a socket's
    path (``<dir>/<uuid4>``) would pass 107 bytes (pytest's ``tmp_path``), none, and nothing is left behind."""
    import shutil
    import stat
    import tempfile

    from relayrl.rollout.cleanup import IPC_PREFIX, engine_ipc_dir

    short = Path(tempfile.mkdtemp(prefix="ipc"))  # pytest's tmp_path is itself too deep for a socket
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(short))
        path = Path(engine_ipc_dir() or "")
        assert path.parent == short and path.name.startswith(f"{IPC_PREFIX}{os.getpid()}-")
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    finally:
        shutil.rmtree(short)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert engine_ipc_dir() is None and not any(tmp_path.iterdir())
