"""Checkpoint and exact resume: SIGKILL a whole run after step 3, ``run.resume=auto`` continues from the
step-2 checkpoint with the same data order and no prompt trained twice (compared with an uninterrupted run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
STEPS = 4


def command(tiny_llama: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "relayrl.cli", "train", "--config-name", "grpo_tiny", f"model.path={tiny_llama}",
            f"run.output_dir={out}", f"run.steps={STEPS}", "run.checkpoint_every=2", "logging.wandb=disabled",
            "run.save_final=false", *extra]


def prompt_log(out: Path) -> list[list[int]]:
    (run,) = out.glob("grpo_tiny-*")
    return [json.loads(x)["prompt_ids"] for x in (run / "prompts.jsonl").read_text().splitlines()]


def run_to_end(cmd: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def kill_after_step(cmd: list[str], out: Path, step: int) -> None:
    """Start the run in its own process group and SIGKILL the whole group once ``step`` is logged."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    try:
        while time.time() < deadline and proc.poll() is None:
            metrics = list(out.glob("grpo_tiny-*/metrics.jsonl"))
            if metrics and len(metrics[0].read_text().splitlines()) >= step:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_sigkill_then_resume_auto_keeps_the_data_order(tiny_llama, tmp_path):
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    run_to_end(command(tiny_llama, reference))
    kill_after_step(command(tiny_llama, crashed), crashed, step=3)
    (run,) = crashed.glob("grpo_tiny-*")
    assert (run / "checkpoints" / "step_000002" / "COMPLETE").exists()
    assert not list((run / "checkpoints").glob("step_000004"))
    resumed = run_to_end(command(tiny_llama, crashed, "run.resume=auto"))
    assert "resumed" in resumed.stdout and "step_000002" in resumed.stdout
    expected, got = prompt_log(reference), prompt_log(crashed)
    assert got == expected and len(got) == STEPS
    flat = [p for ids in got for p in ids]
    assert len(flat) == len(set(flat))                       # no prompt trained twice
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["accounting/issued"] == rows[-1]["accounting/trained"] + rows[-1]["accounting/dropped"]
