"""Two Ray nodes on this machine (`ray start --head` + `ray start --address`): a run joins the cluster,
Ray splits rollout and trainer across the nodes, and weight sync falls back from shm to broadcast."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.controller.ray_nodes import ENV, two_nodes

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster():
    """Head and worker with 2 logical CPUs each (``ray_nodes.two_nodes``); yields the head's address."""
    with two_nodes() as nodes:
        yield nodes.address


def test_run_spans_two_nodes_and_syncs_by_broadcast(cluster, tiny_llama, tmp_path):
    # rollout needs a node's 2 CPUs, trainer 1 + scoring 1 fit the other: the bundles cannot share a node
    cmd = [
        sys.executable,
        "-m",
        "relayrl.cli",
        "train",
        "--config-name",
        "grpo_tiny",
        f"model.path={tiny_llama}",
        f"run.ray_address={cluster}",
        f"run.output_dir={tmp_path}",
        "run.steps=2",
        "rollout.num_cpus=2",
        "trainer.num_cpus=1",
        "logging.wandb=disabled",
        "run.save_final=false",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "weightsync.backend=shm -> broadcast" in out.stdout
    rows = [json.loads(x) for x in next(tmp_path.glob("grpo_tiny-*/metrics.jsonl")).read_text().splitlines()]
    assert [r["weightsync/version"] for r in rows] == [1.0, 2.0]
    assert all(r["weightsync/bytes"] > 0 and r["rollout/min_version"] == r["step"] - 1 for r in rows)
