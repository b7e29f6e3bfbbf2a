"""Ctrl-C: a terminal sends SIGINT to the whole foreground process group. ``relayrl train`` then exits with
status 130 and one line instead of a traceback, status.json says ``interrupted``, and the run keeps its steps
and committed checkpoints for ``run.resume=auto``."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from relayrl.controller.checkpoint import latest
from tests.controller.resume_helpers import command, kill_group, start_until

pytestmark = pytest.mark.slow


def like_a_terminal() -> None:
    """The run takes SIGINT as a terminal's foreground job does, even when pytest itself was started in the
    background of a non-interactive shell (``cmd &``), which sets SIGINT to ignored for everything it starts;
    Python then installs no KeyboardInterrupt handler, and the run would go on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_exits_130_with_one_line_and_marks_the_run_interrupted(tiny_llama, tmp_path):
    cmd = [*command(tiny_llama, tmp_path), "run.steps=40"]  # Hydra: the last value of a key wins

    def committed() -> bool:
        return any(latest(run) for run in tmp_path.glob("grpo_tiny-*"))

    proc = start_until(
        cmd, committed, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=like_a_terminal
    )
    try:
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    (run,) = tmp_path.glob("grpo_tiny-*")
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in out + err, err[-3000:]
    record = json.loads((run / "status.json").read_text())
    assert record["status"] == "interrupted" and 2 <= record["steps_done"] < 40
    (line,) = [x for x in err.splitlines() if "relayrl: interrupted" in x]
    assert f"after {record['steps_done']} step(s)" in line and latest(run).name in line
