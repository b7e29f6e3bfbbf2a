"""Ctrl-C: a terminal sends SIGINT to the whole foreground process group. ``relayrl train`` then exits with
status 130 and one line instead of a traceback, status.json says ``interrupted``, and the run keeps its steps
and committed checkpoints for ``run.resume=auto``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from relayrl.controller.checkpoint import latest
from tests.controller.resume_helpers import command

pytestmark = pytest.mark.slow


def test_ctrl_c_exits_130_with_one_line_and_marks_the_run_interrupted(tiny_llama, tmp_path):
    cmd = [*command(tiny_llama, tmp_path), "run.steps=40"]      # Hydra: the last value of a key wins
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            runs = list(tmp_path.glob("grpo_tiny-*"))
            if runs and latest(runs[0]) is not None:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    (run,) = tmp_path.glob("grpo_tiny-*")
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in out + err, err[-3000:]
    record = json.loads((run / "status.json").read_text())
    assert record["status"] == "interrupted" and 2 <= record["steps_done"] < 40
    (line,) = [x for x in err.splitlines() if "relayrl: interrupted" in x]
    assert f"after {record['steps_done']} step(s)" in line and latest(run).name in line
