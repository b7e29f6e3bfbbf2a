"""Two Ray nodes on this machine (`ray start --head` + `ray start --address`): a run joins the cluster,
Ray splits rollout and trainer across the nodes, and weight sync falls back from shm to broadcast."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from relayrl.trainer.group import free_port

pytestmark = pytest.mark.slow


def _ray(*args: str) -> None:
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), *args], check=True,
                   capture_output=True, timeout=120)


@pytest.fixture
def two_nodes(tmp_path):
    """Head and worker with 2 logical CPUs each; torn down by killing exactly this cluster's processes
    (``ray stop`` would take every Ray on the machine with it)."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus=2", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    try:
        _ray("start", "--head", f"--port={port}", "--include-dashboard=false", *common)
        _ray("start", f"--address={address}", *common)
        yield address
    finally:
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if address in cmd or f"--gcs_server_port={port}" in cmd:
                try:
                    os.kill(proc.info["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_run_spans_two_nodes_and_syncs_by_broadcast(two_nodes, tiny_llama, tmp_path):
    # rollout needs a node's 2 CPUs, trainer 1 + scoring 1 fit the other: the bundles cannot share a node
    cmd = [sys.executable, "-m", "relayrl.cli", "train", "--config-name", "grpo_tiny", f"model.path={tiny_llama}",
           f"run.ray_address={two_nodes}", f"run.output_dir={tmp_path}", "run.steps=2", "rollout.num_cpus=2",
           "trainer.num_cpus=1", "logging.wandb=disabled", "run.save_final=false"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "weightsync.backend=shm -> broadcast" in out.stdout
    rows = [json.loads(x) for x in next(tmp_path.glob("grpo_tiny-*/metrics.jsonl")).read_text().splitlines()]
    assert [r["weightsync/version"] for r in rows] == [1.0, 2.0]
    assert all(r["weightsync/bytes"] > 0 and r["rollout/min_version"] == r["step"] - 1 for r in rows)
