"""Chaos: kill -9 the vLLM engine process three times during a run; the run replaces the replica each
time, generates the lost chunk again, and finishes with every issued prompt trained or dropped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow
STEPS, KILLS = 6, 3


def engine_processes(root: int) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(root).children(recursive=True):
        try:
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def steps_logged(out: Path) -> int:
    files = list(out.glob("grpo_tiny-*/metrics.jsonl"))
    return len(files[0].read_text().splitlines()) if files else 0


def test_engine_killed_three_times_and_the_run_finishes(tiny_llama, tmp_path):
    cmd = [sys.executable, "-m", "relayrl.cli", "train", "--config-name", "grpo_tiny", f"model.path={tiny_llama}",
           f"run.output_dir={tmp_path}", f"run.steps={STEPS}", "logging.wandb=disabled", "run.save_final=false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    killed, deadline = 0, time.time() + 900
    try:
        while killed < KILLS and time.time() < deadline and proc.poll() is None:
            engines = engine_processes(proc.pid)
            if engines and steps_logged(tmp_path) >= killed + 1:        # one kill after each of steps 1..3
                os.kill(engines[0].pid, signal.SIGKILL)
                killed += 1
                while time.time() < deadline and engine_processes(proc.pid) and proc.poll() is None:
                    if engines[0].pid not in [p.pid for p in engine_processes(proc.pid)]:
                        break
                    time.sleep(0.2)
                time.sleep(5)
            time.sleep(0.3)
        output, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed == KILLS
    assert proc.returncode == 0, output[-4000:]
    assert output.count("died") >= KILLS and "prompts: issued" in output
    (metrics,) = tmp_path.glob("grpo_tiny-*/metrics.jsonl")
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    last = rows[-1]
    assert last["rollout/restarts"] == KILLS
    assert last["accounting/issued"] >= last["accounting/trained"] + last["accounting/dropped"]
    assert last["accounting/trained"] == STEPS * 2                      # grpo_tiny: 2 prompts per step


def actor_processes(root: int, name: str) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(root).children(recursive=True):
        try:
            if name in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_killed_trainer_rank_restarts_from_the_checkpoint(tiny_llama, tmp_path):
    """kill -9 one of two trainer ranks after step 3: the run restarts from the step-2 checkpoint and
    ends with every step logged once, in order."""
    cmd = [sys.executable, "-m", "relayrl.cli", "train", "--config-name", "grpo_tiny", f"model.path={tiny_llama}",
           f"run.output_dir={tmp_path}", "run.steps=5", "run.checkpoint_every=2", "trainer.world_size=2",
           "trainer.num_cpus=0.5", "rollout.num_cpus=0.5", "logging.wandb=disabled", "run.save_final=false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 900
    try:
        while time.time() < deadline and proc.poll() is None and steps_logged(tmp_path) < 3:
            time.sleep(0.3)
        ranks = actor_processes(proc.pid, "TrainerActor")
        assert ranks, "no trainer rank process found"
        os.kill(ranks[-1].pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-4000:]
    assert "restarting from step_000002" in output
    (run,) = tmp_path.glob("grpo_tiny-*")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    prompts = [json.loads(x)["prompt_ids"] for x in (run / "prompts.jsonl").read_text().splitlines()]
    flat = [p for ids in prompts for p in ids]
    assert len(prompts) == 5 and len(flat) == len(set(flat))
