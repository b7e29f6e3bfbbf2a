"""Chaos: faults injected into real runs (tiny model, real vLLM, Ray, FSDP2). Each run must finish and
train exactly the prompts an uninterrupted run of the same config and seed trains, in the same order,
with every step logged once.

Each test prints one line for the chaos table: fault, times injected, run finished?, prompts lost,
steps logged twice (run with ``-s`` to see them).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from tests.controller.resume_helpers import command, prompt_log, run_to_end

pytestmark = pytest.mark.slow
STEPS, KILLS = 6, 3


@pytest.fixture(scope="module")
def reference(tiny_llama, tmp_path_factory) -> list[list[int]]:
    """prompts.jsonl of an uninterrupted grpo_tiny run of STEPS steps (the prompt order does not depend
    on the trainer's world size: sync mode draws B prompts per step from the seeded sampler)."""
    out = tmp_path_factory.mktemp("reference")
    run_to_end(command(tiny_llama, out, f"run.steps={STEPS}"))
    return prompt_log(out)


def processes(root: int, name: str) -> list[psutil.Process]:
    """Descendants of ``root`` whose name or command line (a Ray worker's title) contains ``name``."""
    out = []
    for p in psutil.Process(root).children(recursive=True):
        try:
            if name in p.name() or name in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def steps_logged(out: Path) -> int:
    files = list(out.glob("grpo_tiny-*/metrics.jsonl"))
    return len(files[0].read_text().splitlines()) if files else 0


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def wait_until(proc: subprocess.Popen, ready, deadline_s: float = 900) -> bool:
    """Poll ``ready()`` until true, the run exits or the hang guard expires."""
    deadline = time.time() + deadline_s
    while time.time() < deadline and proc.poll() is None:
        if ready():
            return True
        time.sleep(0.1)
    return False


def finish(proc: subprocess.Popen) -> str:
    try:
        output, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return output


def report(fault: str, injected: int, proc: subprocess.Popen, out: Path, reference: list[list[int]]) -> list[dict]:
    """The run's metrics rows; prints the chaos-table line and returns the rows."""
    (run,) = out.glob("grpo_tiny-*")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    got = prompt_log(out)
    expected = {p for ids in reference[: len(got)] for p in ids}
    lost = len(expected - {p for ids in got for p in ids})
    twice = sum(n - 1 for n in Counter(r["step"] for r in rows).values())
    print(
        f"\nCHAOS | {fault} | injected {injected} | finished {proc.returncode == 0} | prompts lost {lost} "
        f"| steps logged twice {twice}"
    )
    return rows


def test_engine_killed_three_times_and_the_run_trains_the_same_prompts(tiny_llama, tmp_path, reference):
    """kill -9 the vLLM EngineCore after each of steps 1..3: the replica is replaced and the lost chunk
    generated again under its seq, so prompts.jsonl equals the uninterrupted run's (a run that dropped
    the chunk and drew fresh prompts would differ)."""
    proc = start(command(tiny_llama, tmp_path, f"run.steps={STEPS}", "rollout.start_timeout_s=300"))
    killed = 0
    while killed < KILLS and wait_until(
        proc, lambda n=killed + 1: steps_logged(tmp_path) >= n and processes(proc.pid, "EngineCore")
    ):
        engine = processes(proc.pid, "EngineCore")[0]
        os.kill(engine.pid, signal.SIGKILL)
        killed += 1
        wait_until(
            proc,
            lambda dead=engine.pid: (
                dead not in [p.pid for p in processes(proc.pid, "EngineCore")] and processes(proc.pid, "EngineCore")
            ),
        )  # the replacement's engine is up
    output = finish(proc)
    rows = report("kill -9 EngineCore after steps 1-3", killed, proc, tmp_path, reference)
    assert killed == KILLS and proc.returncode == 0, output[-4000:]
    assert prompt_log(tmp_path) == reference  # same prompts, same order, none lost
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["rollout/restarts"] >= KILLS  # + any replacement that died or hung while starting
    assert rows[-1]["accounting/trained"] == STEPS * 2  # grpo_tiny: 2 prompts per step


def test_replacement_killed_while_it_starts_is_another_attempt(tiny_llama, tmp_path, reference):
    """kill -9 the EngineCore after step 1, then kill -9 the replacement actor during its __init__:
    the failed re-creation is one more restart attempt (after a backoff), not the end of the run."""
    proc = start(command(tiny_llama, tmp_path, "run.steps=3"))
    injected = 0
    if wait_until(proc, lambda: steps_logged(tmp_path) >= 1 and processes(proc.pid, "EngineCore")):
        os.kill(processes(proc.pid, "EngineCore")[0].pid, signal.SIGKILL)
        injected += 1
    if wait_until(proc, lambda: processes(proc.pid, "RolloutActor.__init__")):
        os.kill(processes(proc.pid, "RolloutActor.__init__")[0].pid, signal.SIGKILL)
        injected += 1
    output = finish(proc)
    rows = report("kill -9 EngineCore, then the replacement in __init__", injected, proc, tmp_path, reference)
    assert injected == 2 and proc.returncode == 0, output[-4000:]
    assert "died or hung while starting (" in output
    assert rows[-1]["rollout/restarts"] == 2  # the failed attempt counts
    assert prompt_log(tmp_path) == reference[:3]
    assert [r["step"] for r in rows] == [1, 2, 3]


def test_replacement_hung_while_it_starts_is_killed_and_another_attempt(tiny_llama, tmp_path, reference):
    """kill -9 the EngineCore after step 1, then SIGSTOP the replacement's EngineCore as it appears: that
    replacement never comes up; past rollout.start_timeout_s its whole process tree is killed (found through
    Ray's actor table: it never answered) and the next attempt finishes the run."""
    proc = start(command(tiny_llama, tmp_path, "run.steps=3", "rollout.start_timeout_s=90"))
    stopped = []
    try:
        if wait_until(proc, lambda: steps_logged(tmp_path) >= 1 and processes(proc.pid, "EngineCore")):
            first = processes(proc.pid, "EngineCore")[0].pid
            os.kill(first, signal.SIGKILL)
            if wait_until(proc, lambda: [p for p in processes(proc.pid, "EngineCore") if p.pid != first]):
                stopped.append(next(p.pid for p in processes(proc.pid, "EngineCore") if p.pid != first))
                os.kill(stopped[0], signal.SIGSTOP)
        output = finish(proc)
        alive = [
            pid for pid in stopped if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        ]
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    rows = report("kill -9 EngineCore, then SIGSTOP the replacement's", 1 + len(stopped), proc, tmp_path, reference)
    assert stopped and proc.returncode == 0, output[-4000:]
    assert "hung while starting (TimeoutError)" in output, output[-4000:]
    assert alive == []  # the hung engine was killed with its actor
    assert rows[-1]["rollout/restarts"] >= 2  # the hung attempt counts
    assert prompt_log(tmp_path) == reference[:3]
    assert [r["step"] for r in rows] == [1, 2, 3]


def test_hung_engine_passes_the_generate_deadline_and_is_replaced(tiny_llama, tmp_path, reference):
    """SIGSTOP the EngineCore after step 1: the next generate call never returns; past
    rollout.generate_timeout_s the replica is treated as dead, replaced, and the chunk regenerated."""
    proc = start(command(tiny_llama, tmp_path, "run.steps=3", "rollout.generate_timeout_s=60"))
    stopped = []
    try:
        if wait_until(proc, lambda: steps_logged(tmp_path) >= 1 and processes(proc.pid, "EngineCore")):
            stopped.append(processes(proc.pid, "EngineCore")[0].pid)
            os.kill(stopped[0], signal.SIGSTOP)
        output = finish(proc)
    finally:
        for pid in stopped:  # the hung engine outlives its killed actor: end it here
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    rows = report("SIGSTOP EngineCore (hung generate)", len(stopped), proc, tmp_path, reference)
    assert stopped and proc.returncode == 0, output[-4000:]
    assert rows[-1]["rollout/restarts"] == 1, output[-4000:]  # no other fault: the deadline fired
    assert prompt_log(tmp_path) == reference[:3]
    assert [r["step"] for r in rows] == [1, 2, 3]


def test_killed_trainer_rank_restarts_from_the_checkpoint(tiny_llama, tmp_path, reference):
    """kill -9 one of two trainer ranks at a fixed boundary the run signals: step 3 logged and the step-2
    checkpoint committed. The run restarts from step_000002 and ends with the uninterrupted run's
    prompts, every step logged once, in order."""
    cmd = command(
        tiny_llama,
        tmp_path,
        "run.steps=5",
        "run.checkpoint_every=2",
        "trainer.world_size=2",
        "trainer.num_cpus=0.5",
        "rollout.num_cpus=0.5",
    )
    proc = start(cmd)
    checkpoint = lambda: list(tmp_path.glob("grpo_tiny-*/checkpoints/step_000002/COMPLETE"))  # noqa: E731
    injected = 0
    if wait_until(proc, lambda: steps_logged(tmp_path) >= 3 and checkpoint() and processes(proc.pid, "TrainerActor")):
        os.kill(processes(proc.pid, "TrainerActor")[-1].pid, signal.SIGKILL)
        injected += 1
    output = finish(proc)
    rows = report("kill -9 trainer rank after step 3", injected, proc, tmp_path, reference)
    assert injected == 1 and proc.returncode == 0, output[-4000:]
    assert re.search(r"restarting from step_00000[24]", output)  # step 2's, or 4's if it landed first
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert prompt_log(tmp_path) == reference[:5]
