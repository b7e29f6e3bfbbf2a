"""Two Ray nodes on this machine (`ray start --head` + `ray start --address`): a run joins the cluster,
Ray splits rollout and trainer across the nodes, and weight sync falls back from shm to broadcast."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from relayrl.rendezvous import free_port

pytestmark = pytest.mark.slow


# Ray 2.60 turns token auth on when ~/.ray/auth_token exists; a throwaway local cluster needs none.
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}


def _ray(*args: str) -> str:
    out = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ray"), *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    return out.stdout + out.stderr


def _kill_cluster(port: int) -> None:
    """SIGKILL exactly this cluster's processes: its GCS, and whatever names its port or its session
    (``ray stop`` would take every Ray on the machine with it, other test sessions' included)."""
    procs = list(psutil.process_iter(["pid", "cmdline"]))
    cmds = {p.info["pid"]: " ".join(p.info["cmdline"] or []) for p in procs}
    sessions = {
        part.split("/")[3]
        for cmd in cmds.values()
        if f"--gcs_server_port={port}" in cmd
        for part in cmd.split()
        if part.startswith("--log_dir=/tmp/ray/session_")
    }
    for pid, cmd in cmds.items():
        if f":{port}" in cmd or f"--gcs_server_port={port}" in cmd or any(s in cmd for s in sessions):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def two_nodes():
    """Head and worker with 2 logical CPUs each, on this machine's node IP."""
    port = free_port()
    try:
        head = _ray(
            "start", "--head", f"--port={port}", "--include-dashboard=false", "--num-cpus=2", "--disable-usage-stats"
        )
        address = next(
            line.split("--address=")[1].strip(" '\"") for line in head.splitlines() if "ray start --address=" in line
        )
        _ray("start", f"--address={address}", "--num-cpus=2", "--disable-usage-stats")
        yield address
    finally:
        _kill_cluster(port)
        current = Path("/tmp/ray/ray_current_cluster")  # `ray start` records itself as the default address
        if current.exists() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()


def test_run_spans_two_nodes_and_syncs_by_broadcast(two_nodes, tiny_llama, tmp_path):
    # rollout needs a node's 2 CPUs, trainer 1 + scoring 1 fit the other: the bundles cannot share a node
    cmd = [
        sys.executable,
        "-m",
        "relayrl.cli",
        "train",
        "--config-name",
        "grpo_tiny",
        f"model.path={tiny_llama}",
        f"run.ray_address={two_nodes}",
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
