"""Engine occupancy: the sequences vLLM's scheduler runs per engine step, summed in each engine and combined
over the replicas weighted by the steps each ran (numbers worked by hand)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from vllm.v1.metrics.stats import SchedulerStats

from relayrl.rollout.occupancy import Occupancy, engine_memory, occupancy_metrics, process_tree_gb


def test_take_gives_means_per_engine_step_and_resets():
    batch = Occupancy()
    for running, waiting in [(8, 8), (6, 2), (4, 0)]:
        batch.add(running, waiting)
    assert batch.take() == {"steps": 3.0, "running": 6.0, "waiting": pytest.approx(10 / 3)}  # 18/3, 10/3
    assert batch.take() == {"steps": 0.0, "running": 0.0, "waiting": 0.0}  # reset; no step: 0, not 0/0
    batch.add(2, 1)
    assert batch.take() == {"steps": 1.0, "running": 2.0, "waiting": 1.0}  # only what came after the take


def test_the_stat_logger_records_each_engine_step_and_skips_steps_without_scheduler_stats():
    """vLLM builds the logger from the factory ``logger()`` returns and calls ``record`` after every engine
    step; a call that carries no ``SchedulerStats`` (iteration stats only) is no engine step here."""
    batch = Occupancy()
    recorder = batch.logger()(vllm_config=None)
    recorder.record(SchedulerStats(num_running_reqs=5, num_waiting_reqs=3), None)
    recorder.record(None, None)
    recorder.record(SchedulerStats(num_running_reqs=7, num_waiting_reqs=0), None, None, 0)
    assert batch.take() == {"steps": 2.0, "running": 6.0, "waiting": 1.5}


def test_replicas_combine_weighted_by_their_engine_steps():
    """Replica 0 ran 2 steps of 8 sequences, replica 1 ran 6 steps of 4: (2*8 + 6*4) / 8 = 5 sequences per
    step, not the unweighted (8 + 4) / 2 = 6; occupancy 5 / 8 of a target of 8."""
    replies = [{"steps": 2.0, "running": 8.0, "waiting": 1.0}, {"steps": 6.0, "running": 4.0, "waiting": 0.0}]
    assert occupancy_metrics(replies, target=8) == {
        "rollout/running": 5.0,
        "rollout/waiting": 0.25,  # (2*1 + 6*0) / 8
        "rollout/occupancy": 0.625,
        "rollout/engine_steps": 8.0,
    }


@pytest.mark.parametrize(
    "replies", [[], [{"steps": 0.0, "running": 0.0, "waiting": 0.0}]], ids=["no replica answered", "no step"]
)
def test_no_engine_step_is_zero_occupancy(replies):
    out = occupancy_metrics(replies, target=8)
    assert out == {"rollout/running": 0.0, "rollout/waiting": 0.0, "rollout/occupancy": 0.0, "rollout/engine_steps": 0}


def test_a_replica_without_steps_does_not_dilute_the_others():
    idle = {"steps": 0.0, "running": 0.0, "waiting": 0.0}
    busy = {"steps": 4.0, "running": 6.0, "waiting": 2.0}
    assert occupancy_metrics([idle, busy], target=8)["rollout/occupancy"] == 0.75  # 6 / 8


def test_engine_memory_counts_the_processes_under_the_actor():
    """A child holding 300 MB (a vLLM engine core runs in a child of its actor) raises this process tree's
    memory by at least that, though this process itself holds no more."""
    before = process_tree_gb()
    code = "import sys, time; a = bytearray(300_000_000); print('up', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        assert process_tree_gb() - before >= 0.3
    finally:
        child.kill()
        child.wait()


def test_engine_memory_counts_the_engine_processes_the_server_forked_beside_its_host():
    """With the driver's server, the engine host, its engine core and its worker are all forked by the server,
    none below another; each is registered under the actor (``cleanup.register``), and the host, which reports
    the memory, knows its actor from ``OWNER_ENV``. Here this test is the actor, a 300 MB process reparented
    away from it is the worker, and a child told its owner is the host: the host must count the worker."""
    import os

    import psutil

    from relayrl.rollout import cleanup
    from relayrl.rollout.forkserver import OWNER_ENV

    hold = "import time; a = bytearray(300_000_000); time.sleep(60)"
    spawn = (
        "import subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, '-c', {hold!r}], stdout=subprocess.DEVNULL); print(p.pid)"
    )
    worker = psutil.Process(int(subprocess.check_output([sys.executable, "-c", spawn], text=True)))
    host = [sys.executable, "-c", "from relayrl.rollout.occupancy import process_tree_gb; print(process_tree_gb())"]
    try:
        while worker.memory_info().rss < 300_000_000:
            pass
        cleanup.register(os.getpid(), worker.pid)
        alone = float(subprocess.check_output(host, text=True))
        told = float(subprocess.check_output(host, text=True, env={**os.environ, OWNER_ENV: str(os.getpid())}))
        assert alone < 0.3  # the host's own tree misses the worker: the defect this guards against
        assert told >= 0.3 + 0.9 * psutil.Process().memory_info().rss / 1e9  # the actor, and the worker
    finally:
        worker.kill()
        cleanup.forget_owned(os.getpid())


def test_engine_memory_is_the_largest_replica():
    replies = [{"steps": 1.0, "memory_gb": 2.5}, {"steps": 1.0, "memory_gb": 4.0}, {"steps": 0.0}]
    assert engine_memory(replies) == {"memory/engine_gb": 4.0}
    assert engine_memory([]) == {"memory/engine_gb": 0.0}
