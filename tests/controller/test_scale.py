"""``relayrl scale``: rollout replicas join and leave a running job. The fast tests check the control file's
refusals by hand; the slow one runs a real job in a subprocess and scales it 1 -> 2 -> 1."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from relayrl.controller.membership import CONTROL_FILE, ScaleError, read_target, request_scale
from relayrl.monitor.runs import read_records

ROOT = Path(__file__).resolve().parents[2]


def _run_dir(tmp_path: Path, pid: int, status: str = "running", low: int = 0) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"status": status, "pid": pid, "host": socket.gethostname()}))
    (run / "config.yaml").write_text(yaml.safe_dump({"rollout": {"autoscale": {"min": low, "max": 0}}}))
    return run


@pytest.fixture
def driver():
    """A live process standing in for the run's driver (status.json names its pid)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_scale_writes_the_target_the_driver_reads(tmp_path, driver):
    run = _run_dir(tmp_path, driver)
    assert read_target(run) is None
    assert "2 rollout replica(s)" in request_scale(run, 2)
    assert read_target(run) == 2
    (run / CONTROL_FILE).write_text('{"replicas": "many"')  # half-written or hand-edited: ignored
    assert read_target(run) is None


@pytest.mark.parametrize(
    "status, live, replicas, low, match",
    [
        ("finished", True, 2, 0, "is not a running run"),
        ("running", False, 2, 0, "is not a running run"),  # status.json says running, its pid is gone
        ("running", True, 0, 0, "below rollout.autoscale.min=1"),
        ("running", True, 1, 2, "below rollout.autoscale.min=2"),
    ],
)
def test_scale_is_refused_in_one_line_and_changes_nothing(tmp_path, driver, status, live, replicas, low, match):
    run = _run_dir(tmp_path, driver if live else 2**22 + 12345, status, low)
    with pytest.raises(ScaleError, match=match) as err:
        request_scale(run, replicas)
    assert "\n" not in str(err.value) and "nothing changed" in str(err.value)
    assert not (run / CONTROL_FILE).exists()


def test_cli_scale_exits_2_on_a_run_that_is_not_running(tmp_path):
    run = _run_dir(tmp_path, 2**22 + 12345, "failed")
    done = subprocess.run(
        [sys.executable, "-m", "relayrl", "scale", str(run), "--replicas", "2"], capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is not a running run" in done.stderr


def _first(run: Path, replicas: int, after: int = 0, count: int = 1) -> dict | None:
    """The ``count``-th step record after step ``after`` that logged ``replicas`` serving."""
    found = [r for r in read_records(run) if r["step"] > after and r["rollout/replicas"] == replicas]
    return found[count - 1] if len(found) >= count else None


def _wait(what: str, ok, proc: subprocess.Popen, timeout_s: float = 240.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (got := ok()) is not None:
            return got
        assert proc.poll() is None, f"the run ended while waiting for {what}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_running_job_scales_up_and_down_and_loses_nothing(tmp_path):
    """grpo_tiny from 1 replica: ``relayrl scale`` to 2, a replica joins and serves; then to 1, one drains and
    leaves. Every step's post-sync probe asks both engines (verify_samples=2 spreads the sequences over the
    replicas), so the joiner runs the trainer's current weights; the accounting holds at the end, both
    replicas scored generate calls, and the run trains every step."""
    out = tmp_path / "runs"
    log = (tmp_path / "train.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "relayrl",
            "train",
            "--config-name",
            "grpo_tiny",
            "run.steps=60",
            f"run.output_dir={out}",
            "placement.num_cpus=5",  # room for a second replica on this one node
            "weightsync.verify_every=1",
            "weightsync.verify_samples=2",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    try:
        run = _wait("the run dir", lambda: next(iter(out.glob("*/metrics.jsonl")), None), proc).parent
        request_scale(run, 2)
        # 3 steps at 2 replicas before the scale-down: a request right after the join raced the joiner's
        # first call (the step that logged the join had launched its chunk on replica 0 already)
        joined = _wait("3 steps at 2 replicas", lambda: _first(run, 2, count=3), proc)
        request_scale(run, 1)
        _wait("back to 1 replica", lambda: _first(run, 1, after=joined["step"]), proc)
        assert proc.wait(timeout=600) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "train.log").read_text()
    records = read_records(run)
    assert [r["step"] for r in records] == list(range(1, 61))
    two = [r for r in records if r["rollout/replicas"] == 2]
    assert two and all(r["mismatch/mean_abs"] < 0.05 for r in two)
    assert "rollout replica 1 joined" in text and "left; 1 serving" in text
    assert "in flight at the end 0" in text.split("prompts: issued")[-1]
    calls = text.split("generate calls scored per replica: ")[-1].split(";")[0]
    assert len(calls.split(",")) == 2 and all(int(c.split(": ")[1]) > 0 for c in calls.split(","))
