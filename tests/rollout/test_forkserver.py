"""``rollout.forkserver`` without an engine: what a child takes from its parent, and the cores it binds."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from relayrl.rollout import forkserver
from relayrl.rollout.forkserver import EngineContext, omp_cpus


@pytest.mark.parametrize("env, cpus", [
    ({"GOMP_CPU_AFFINITY": "2 3"}, {2, 3}),                    # vLLM's GNU OpenMP form
    ({"OMP_PLACES": "{0,1}"}, {0, 1}),                         # its generic form
    ({"GOMP_CPU_AFFINITY": "1", "OMP_PLACES": "{0}"}, {1}),    # GNU first, as vLLM sets only one
    ({}, set()),                                              # nothing set: leave the affinity alone
])
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
    code = ("import multiprocessing.forkserver as f; from relayrl.rollout import forkserver; "
            "forkserver.PRELOAD.clear(); assert f._forkserver._forkserver_pid is None; "
            "forkserver.use_forkserver(); print(f._forkserver._forkserver_pid)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 0


def _title(queue) -> None:
    import setproctitle

    setproctitle.setproctitle("VLLM::EngineCore")
    queue.put(open("/proc/self/comm").read().strip())


def test_child_can_name_itself():
    """vLLM names its processes with setproctitle; a child that rewrote its environment first must still
    be able to (``ps`` and the chaos tests find ``VLLM::EngineCore`` by that name)."""
    ctx = EngineContext()
    queue = ctx.Queue()
    proc = ctx.Process(target=_title, args=(queue,))
    proc.start()
    assert queue.get(timeout=60) == "VLLM::EngineCor"      # /proc comm keeps 15 characters
    proc.join(timeout=60)
