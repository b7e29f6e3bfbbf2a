"""``rollout.autoscale``: a run on a one-node Ray cluster asks for a second replica; a node started on this host
with ``ray start --address`` joins mid-run and its replica serves; the node is killed and its replica leaves;
``relayrl scale`` down to 1 then ends the replica that was waiting for a node. Nothing is lost."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from relayrl.controller.membership import request_scale
from relayrl.monitor.runs import read_records
from tests.controller.ray_nodes import ENV, head_node, kill_node, worker_node
from tests.controller.test_scale import _first, _wait

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _log_has(path: Path, text: str) -> bool | None:
    return True if text in path.read_text() else None


def test_a_node_joins_and_leaves_a_running_job(tiny_llama, tmp_path):
    # the head's 3 CPUs hold one replica, the trainer rank and scoring; the second replica waits for a node
    out, log_path = tmp_path / "runs", tmp_path / "train.log"
    with head_node(cpus=3) as head, log_path.open("w") as log:
        cmd = [
            *[sys.executable, "-m", "relayrl", "train", "--config-name", "grpo_tiny"],
            f"model.path={tiny_llama}",
            f"run.ray_address={head.address}",
            f"run.output_dir={out}",
            "run.steps=200",
            "rollout.autoscale.max=2",
            "weightsync.verify_every=1",
            "weightsync.verify_samples=2",
            "logging.wandb=disabled",
            "run.save_final=false",
        ]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV)
        try:
            run = _wait("the run dir", lambda: next(iter(out.glob("*/metrics.jsonl")), None), proc).parent
            _wait("step 2", lambda: _first(run, 1, after=1), proc)
            with worker_node(head.address, cpus=1) as node:
                joined = _wait("the node's replica", lambda: _first(run, 2), proc)
                assert kill_node(node) > 0
                _wait("its replica gone", lambda: _first(run, 1, after=joined["step"]), proc)
                _wait("a replica asked for again", lambda: _log_has(log_path, "rollout replica 2 is starting"), proc)
            request_scale(run, 1)
            _wait("the waiting replica ended", lambda: _log_has(log_path, "will not join"), proc)
            assert proc.wait(timeout=900) == 0, log_path.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
            time.sleep(1)
    text = log_path.read_text()
    records = read_records(run)
    assert [r["step"] for r in records] == list(range(1, 201))  # every step trained
    two = [r for r in records if r["rollout/replicas"] == 2]
    assert two and all(r["mismatch/mean_abs"] < 0.05 for r in two)  # the joiner ran the trainer's weights
    assert "rollout replica 1 joined" in text and "rollout replica 1 is gone" in text
    assert "in flight at the end 0" in text.split("prompts: issued")[-1]  # nothing lost
