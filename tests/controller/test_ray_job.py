"""``ray job submit -- relayrl train ...`` against a running cluster (a head with its job server plus a worker
node, on this machine), as docs/cluster.md tells users to launch: the run joins the cluster it was submitted to
without ``run.ray_address``, spans both nodes, and leaves its run dir under the absolute ``run.output_dir``."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid

import pytest

from tests.controller.ray_nodes import Nodes, ray_cli, two_nodes

pytestmark = pytest.mark.slow

RELAYRL = os.path.join(os.path.dirname(sys.executable), "relayrl")
TERMINAL = {"succeeded": "SUCCEEDED", "failed": "FAILED", "was stopped": "STOPPED"}
"""How ``ray job status`` words a finished job (it prints "Status for job '<id>': RUNNING" until then)."""


@pytest.fixture
def job_cluster():
    with two_nodes(dashboard=True) as nodes:
        yield nodes


def job_status(nodes: Nodes, job: str) -> str:
    out = ray_cli("job", "status", f"--address={nodes.dashboard}", job)
    done = [status for words, status in TERMINAL.items() if f"Job '{job}' {words}" in out]
    return done[0] if done else out.rsplit(":", 1)[-1].strip()


def wait_for(nodes: Nodes, job: str, timeout_s: float = 900) -> str:
    """The job's final status, polled every few seconds (a guard against a hang, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while (status := job_status(nodes, job)) not in TERMINAL.values() and time.monotonic() < deadline:
        time.sleep(5)
    return status


def test_submitted_run_joins_the_cluster_and_writes_its_run_dir(job_cluster, tiny_llama, tmp_path):
    job, output_dir, working_dir = f"relayrl-test-{uuid.uuid4().hex[:8]}", tmp_path / "runs", tmp_path / "job"
    working_dir.mkdir()  # uploaded, as a user's project would be: the entrypoint runs in Ray's temporary copy
    (working_dir / "note.txt").write_text("the entrypoint's cwd; runs must not land here\n")
    # rollout needs a node's 2 CPUs, trainer 1 + scoring 1 fit the other: only a run that joined spans both
    train = [RELAYRL, "train", "--config-name", "grpo_tiny", f"model.path={tiny_llama}", "run.steps=2"]
    train += [f"run.output_dir={output_dir}", "rollout.num_cpus=2", "trainer.num_cpus=1"]
    train += ["logging.wandb=disabled", "run.save_final=false"]
    address = f"--address={job_cluster.dashboard}"
    ray_cli(
        "job", "submit", address, f"--submission-id={job}", f"--working-dir={working_dir}", "--no-wait", "--", *train
    )
    status = wait_for(job_cluster, job)
    logs = ray_cli("job", "logs", address, job)
    assert status == "SUCCEEDED", logs[-4000:]

    assert f"relayrl: joined the Ray cluster at {job_cluster.address} (Ray job {job}): 2 nodes, 4 CPUs" in logs
    assert "weightsync.backend=shm -> broadcast" in logs  # rollout and trainer on different nodes
    assert re.search(r"^step 2/2 \| reward -?\d+\.\d{3}", logs, re.MULTILINE), logs[-4000:]
    (run,) = output_dir.glob("grpo_tiny-*")
    assert f"relayrl: run dir {run};" in logs
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
    assert (run / "config.yaml").is_file()
    assert [json.loads(row)["step"] for row in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert any((run / "logs").glob("rollout-*.log")) and any((run / "logs").glob("trainer-*.log"))
