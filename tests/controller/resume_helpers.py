"""Shared by the resume tests: run the CLI as a subprocess, SIGKILL a run's whole process group once a
step is logged and a checkpoint committed, and read back which prompt ids each step trained (``prompts.jsonl``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relayrl.controller.checkpoint import latest

STEPS = 4


def command(tiny_llama: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "relayrl.cli",
        "train",
        "--config-name",
        "grpo_tiny",
        f"model.path={tiny_llama}",
        f"run.output_dir={out}",
        f"run.steps={STEPS}",
        "run.checkpoint_every=2",
        "logging.wandb=disabled",
        "run.save_final=false",
        *extra,
    ]


def prompt_log(out: Path) -> list[list[int]]:
    (run,) = out.glob("grpo_tiny-*")
    return [json.loads(x)["prompt_ids"] for x in (run / "prompts.jsonl").read_text().splitlines()]


def run_to_end(cmd: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def killed_at(run: Path) -> str:
    """The checkpoint a killed run resumes from: step 2's, or step 4's when the SIGKILL (sent once step 3
    is logged and a checkpoint is committed, polled every 0.5 s) landed after step 4 was already written.
    Either way the resumed run must train exactly the uninterrupted run's prompts; which one it is depends
    on the box's speed."""
    ckpt = latest(run)
    assert ckpt is not None and ckpt.name in ("step_000002", "step_000004"), ckpt
    return ckpt.name


def start_until(cmd: list[str], ready: Callable[[], bool], **popen: Any) -> subprocess.Popen:
    """Start the run in its own process group and return it once ``ready()`` holds (polled every 0.5 s, at
    most 600 s). Fails, with the group SIGKILLed, if the run ended first."""
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None and not ready():
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it got there"
    except BaseException:
        kill_group(proc)
        raise
    return proc


def kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def kill_after_step(cmd: list[str], out: Path, step: int) -> None:
    """SIGKILL the run's whole process group once ``step`` is logged and a checkpoint is committed. With
    asynchronous checkpoints, step 2's is committed by the first step that finds its write done: step 3's log
    on a fast box, step 4's save (which waits for it) on a slow one."""

    def ready() -> bool:
        metrics = list(out.glob("grpo_tiny-*/metrics.jsonl"))
        return (
            bool(metrics) and len(metrics[0].read_text().splitlines()) >= step and latest(metrics[0].parent) is not None
        )

    kill_group(start_until(cmd, ready, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def crash_and_resume(
    tiny_llama: Path, tmp_path: Path, *extra: str, expected: list[list[int]] | None = None
) -> tuple[Path, list[dict]]:
    """The resume tests' common part: an uninterrupted run (the reference; or ``expected``, the prompts one
    trained), then one SIGKILLed once step 3 is logged and continued with ``run.resume=auto``. Asserts that
    the resumed run says which checkpoint it resumed from and trains exactly the reference's prompts, step by
    step, none twice, with one metrics row per step. Returns the crashed run's directory and its
    ``metrics.jsonl`` rows."""
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    if expected is None:
        run_to_end(command(tiny_llama, reference, *extra))
        expected = prompt_log(reference)
    kill_after_step(command(tiny_llama, crashed, *extra), crashed, step=3)
    (run,) = crashed.glob("grpo_tiny-*")
    name = killed_at(run)
    resumed = run_to_end(command(tiny_llama, crashed, *extra, "run.resume=auto"))
    assert "resumed" in resumed.stdout and name in resumed.stdout
    got = prompt_log(crashed)
    assert got == expected and len(got) == STEPS
    flat = [p for ids in got for p in ids]
    assert len(flat) == len(set(flat))  # no prompt trained twice
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return run, rows
