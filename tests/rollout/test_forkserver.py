"""``rollout.forkserver`` without an engine: what a child takes from its parent, and the cores it binds."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from relayrl.rollout import forkserver
from relayrl.rollout.forkserver import EngineContext, omp_cpus


@pytest.mark.parametrize(
    "env, cpus",
    [
        ({"GOMP_CPU_AFFINITY": "2 3"}, {2, 3}),  # vLLM's GNU OpenMP form
        ({"OMP_PLACES": "{0,1}"}, {0, 1}),  # its generic form
        ({"GOMP_CPU_AFFINITY": "1", "OMP_PLACES": "{0}"}, {1}),  # GNU first, as vLLM sets only one
        ({}, set()),  # nothing set: leave the affinity alone
    ],
)
def test_omp_cpus(env, cpus):
    assert omp_cpus(env) == cpus


def _report(queue) -> None:
    import torch

    queue.put((os.environ.get("RELAYRL_TEST_VAR"), torch.get_num_threads(), sorted(os.sched_getaffinity(0))))


def test_child_takes_the_environment_of_start_and_its_thread_count(monkeypatch):
    """vLLM sets a worker's variables around ``start()``, after building the process: the child sees them,
    and sizes torch's pool from its ``OMP_NUM_THREADS`` and binds the cores named there."""
    ctx = EngineContext()
    queue = ctx.Queue()
    proc = ctx.Process(target=_report, args=(queue,))
    monkeypatch.setenv("RELAYRL_TEST_VAR", "set after the process was built")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("GOMP_CPU_AFFINITY", "0")
    proc.start()
    assert queue.get(timeout=60) == ("set after the process was built", 1, [0])
    proc.join(timeout=60)
    assert proc.exitcode == 0


def test_use_forkserver_routes_vllm_process_starts_through_the_context(monkeypatch):
    import vllm.v1.engine.utils as engine_utils
    import vllm.v1.executor.multiproc_executor as executor

    monkeypatch.setattr(engine_utils, "get_mp_context", engine_utils.get_mp_context)
    monkeypatch.setattr(executor, "get_mp_context", executor.get_mp_context)
    forkserver.patch_vllm()
    assert engine_utils.get_mp_context() is forkserver.CONTEXT
    assert executor.get_mp_context() is forkserver.CONTEXT


def test_use_forkserver_starts_the_server_at_once():
    """The server starts (and begins its vLLM imports) when the actor calls ``use_forkserver``, not when
    ``AsyncLLM`` forks its first child: the actor's own vLLM import then runs beside the server's. In a
    fresh process (this one's server may be running already), with nothing to preload."""
    code = (
        "import multiprocessing.forkserver as f; from relayrl.rollout import forkserver; "
        "forkserver.PRELOAD.clear(); assert f._forkserver._forkserver_pid is None; "
        "forkserver.use_forkserver(); print(f._forkserver._forkserver_pid)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 0


def _title(queue) -> None:
    import setproctitle

    setproctitle.setproctitle("VLLM::EngineCore")
    queue.put(Path("/proc/self/comm").read_text().strip())


def test_child_can_name_itself():
    """vLLM names its processes with setproctitle; a child that rewrote its environment first must still
    be able to (``ps`` and the chaos tests find ``VLLM::EngineCore`` by that name)."""
    ctx = EngineContext()
    queue = ctx.Queue()
    proc = ctx.Process(target=_title, args=(queue,))
    proc.start()
    assert queue.get(timeout=60) == "VLLM::EngineCor"  # /proc comm keeps 15 characters
    proc.join(timeout=60)


DRIVER = """
import json, sys
from relayrl.rollout import forkserver
forkserver.PRELOAD.clear()
forkserver.start_shared({"RELAYRL_TEST_SHARED": "1"})
spec = {"env": forkserver.shared_actor_env({"RELAYRL_TEST_SHARED": "1"}),
        "mismatch": forkserver.shared_actor_env({"RELAYRL_TEST_SHARED": "2"}),
        "server": forkserver.forkserver._forkserver._forkserver_pid}
print(json.dumps(spec), flush=True)
sys.stdin.read()
forkserver.stop_shared()
"""

ACTOR = """
import json, sys
from relayrl.rollout import forkserver
from tests.rollout.test_forkserver import _say
adopted = forkserver.adopt_shared()
procs = [forkserver.CONTEXT.Process(target=_say, args=(i,)) for i in range(2)]
for p in procs:
    p.start()
print(json.dumps({"adopted": adopted, "children": [p.pid for p in procs]}), flush=True)
sys.stdin.read()
"""


def _say(i: int) -> None:
    import time

    print(f"child {i} {os.getpid()} {os.getppid()} {os.getpgid(0)}", flush=True)
    time.sleep(600)


def _start_actor(script: str, spec: dict) -> subprocess.Popen:
    """A stand-in rollout actor running ``script`` with the environment the driver's server told it to use."""
    return subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **spec["env"], "RELAYRL_TEST_SHARED": "1"},
    )


def _lines(proc: subprocess.Popen, n: int, timeout_s: float = 120.0) -> list[str]:
    """The first ``n`` lines ``proc`` prints; fewer if it prints no more within ``timeout_s``."""
    import queue
    import threading

    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    out = []
    try:
        while len(out) < n:
            out.append(lines.get(timeout=timeout_s))
    except queue.Empty:
        pass
    return out


def _gone(pid: int, within_s: float = 30.0) -> bool:
    import time

    import psutil

    deadline = time.time() + within_s
    while time.time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _unlinked(paths: list[Path], within_s: float = 30.0) -> bool:
    import time

    deadline = time.time() + within_s
    while any(p.exists() for p in paths):
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def _stopped(pid: int, within_s: float = 30.0) -> bool:
    import time

    import psutil

    deadline = time.time() + within_s
    while time.time() < deadline:
        if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
            return True
        time.sleep(0.01)
    return False


def test_engine_processes_of_the_drivers_server_live_as_in_their_actors_tree():
    """A driver starts a server; an "actor" with the matching variable adopts it and starts two children.
    They are the server's children, yet write to the actor's stdout, leave the driver's process group and
    are registered under the actor: when the actor is killed, the running child ends itself, and
    ``kill_process_tree(actor)`` ends the stopped one, which cannot."""
    from relayrl.rollout.cleanup import kill_process_tree, owned

    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    actor, info = None, {"children": []}
    try:
        spec = json.loads(driver.stdout.readline())
        assert spec["env"] and spec["mismatch"] == {}  # an actor with other values is not told
        actor = _start_actor(ACTOR, spec)
        lines = _lines(actor, 3)  # the children print to the actor's stdout
        info = json.loads(next(x for x in lines if x.startswith("{")))
        said = sorted(x.split()[1:] for x in lines if x.startswith("child"))
        assert info["adopted"]
        assert [int(s[1]) for s in said] == sorted(info["children"])
        assert all(int(ppid) == spec["server"] and int(pgid) == int(pid) for _, pid, ppid, pgid in said)
        assert sorted(p.pid for p in owned(actor.pid)) == sorted(info["children"])
        stopped, running = info["children"]
        os.kill(stopped, signal.SIGSTOP)
        assert _stopped(stopped)  # before the kill: a stop still pending lets its watcher run
        os.kill(actor.pid, signal.SIGKILL)
        actor.wait()
        assert _gone(running)  # it saw its actor die
        assert not _gone(stopped, within_s=1)
        assert kill_process_tree(actor.pid) == 1  # the registry still names it
        assert _gone(stopped)
        assert owned(actor.pid) == []
    finally:
        for pid in [*info["children"], *([actor.pid] if actor is not None else [])]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        driver.communicate(timeout=60)
    assert driver.returncode == 0


ACTOR_LOCKS = """
import sys
from relayrl.rollout import forkserver
from tests.rollout.test_forkserver import _hold_a_lock
assert forkserver.adopt_shared()
forkserver.CONTEXT.Process(target=_hold_a_lock, args=(True,)).start()
sys.stdin.read()
"""


def _hold_a_lock(start_child: bool) -> None:
    """An engine process: holds a lock of its default context, as vLLM's worker holds tqdm's (a named
    semaphore in a forkserver child); the first (the host) starts one more such process."""
    import multiprocessing
    import time

    lock = multiprocessing.RLock()
    print("lock", lock._semlock.name, os.environ.get(forkserver.TRACKER_ENV), flush=True)  # type: ignore[attr-defined]
    if start_child:
        forkserver.CONTEXT.Process(target=_hold_a_lock, args=(False,)).start()
    time.sleep(600)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
def test_semaphores_of_killed_engine_processes_are_unlinked():
    """The chaos path: ``kill_process_tree(actor)`` SIGKILLs the actor, its children (its resource tracker among
    them) and the engine processes registered under it, all at once, as Ray kills an actor's children when
    the actor exits. The engine's own resource tracker, started by its first process, is none of them: it
    unlinks the semaphores they left in /dev/shm and exits."""
    from relayrl.rollout.cleanup import kill_process_tree

    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    actor = None
    try:
        spec = json.loads(driver.stdout.readline())
        actor = _start_actor(ACTOR_LOCKS, spec)
        said = [line.split() for line in _lines(actor, 2)]
        files = [Path(f"/dev/shm/sem.{name.lstrip('/')}") for _, name, _ in said]
        trackers = {tracker for *_, tracker in said}
        assert len(files) == 2 and all(f.exists() for f in files)
        assert kill_process_tree(actor.pid) >= 3  # the actor (and its children) and the two engine processes
        actor.wait()
        assert _unlinked(files), [f.name for f in files if f.exists()]
        assert len(trackers) == 1  # the host's, which its child writes to as well
        assert _gone(int(trackers.pop()))  # it exits once it has cleaned up
    finally:
        if actor is not None:
            kill_process_tree(actor.pid)
        driver.communicate(timeout=60)
    assert driver.returncode == 0


def test_an_actor_adopts_only_a_server_started_with_its_values_on_its_host(monkeypatch, tmp_path):
    socket = tmp_path / "listener"
    socket.touch()

    def offered(**changes) -> bool:
        spec = {"address": str(socket), "boot_id": forkserver.boot_id(), "env": {"RELAYRL_TEST_SHARED": "1"}}
        monkeypatch.setenv(forkserver.SHARED_ENV, json.dumps({**spec, **changes}))
        return forkserver.adopt_shared()

    monkeypatch.delenv(forkserver.SHARED_ENV, raising=False)
    assert not forkserver.adopt_shared()  # no server offered
    monkeypatch.setenv("RELAYRL_TEST_SHARED", "2")
    assert not offered()  # started with another value
    monkeypatch.setenv("RELAYRL_TEST_SHARED", "1")
    assert not offered(boot_id="another host")
    assert not offered(address=str(tmp_path / "gone"))


def test_registered_processes_are_matched_by_start_time(tmp_path, monkeypatch):
    """A pid in the registry that now names another process (different start time) is not killed."""
    from relayrl.rollout import cleanup

    monkeypatch.setattr(cleanup, "owned_dir", lambda: tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        cleanup.register(123456789, proc.pid)
        assert [p.pid for p in cleanup.owned(123456789)] == [proc.pid]
        (tmp_path / "123456789").write_text(f"{proc.pid} 1.0\n")
        assert cleanup.owned(123456789) == []
        assert cleanup.kill_process_tree(123456789) == 0 and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_registry_files_of_dead_owners_are_dropped(tmp_path, monkeypatch):
    from relayrl.rollout import cleanup

    monkeypatch.setattr(cleanup, "owned_dir", lambda: tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for owner in (dead.pid, os.getpid()):
        cleanup.register(owner, os.getpid())
    cleanup.forget_dead_owners()
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(os.getpid())]
