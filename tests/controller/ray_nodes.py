"""Two Ray nodes on this machine (``ray start --head`` + ``ray start --address``) for the tests that need a real
multi-node cluster (``test_multinode``, ``test_ray_job``), and the exact clean-up of what they started."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from relayrl.rendezvous import free_port

# Ray 2.60 turns token auth on when ~/.ray/auth_token exists; a throwaway local cluster needs none.
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}
RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def ray_cli(*args: str, timeout: float = 120) -> str:
    """Run the venv's ``ray`` command; its stdout and stderr together (it prints addresses on both)."""
    out = subprocess.run([RAY, *args], check=True, capture_output=True, text=True, timeout=timeout, env=ENV)
    return out.stdout + out.stderr


def cluster_pids(port: int) -> set[int]:
    """This cluster's processes: its GCS and whatever names its port or its session on the command line, and,
    among those that renamed themselves (``ray::DashboardAgent``, actors), whatever writes into the session's
    logs or runs as a job's entrypoint (its ``RAY_ADDRESS`` names the port)."""
    procs = list(psutil.process_iter(["pid", "cmdline"]))
    cmds = {p.info["pid"]: " ".join(p.info["cmdline"] or []) for p in procs}
    sessions = {
        part.split("/")[3]
        for cmd in cmds.values()
        if f"--gcs_server_port={port}" in cmd
        for part in cmd.split()
        if part.startswith("--log_dir=/tmp/ray/session_")
    }
    ours = {pid for pid, cmd in cmds.items() if f":{port}" in cmd or any(s in cmd for s in sessions)}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            files = [f.path for f in proc.open_files()]
            if proc.environ().get("RAY_ADDRESS", "").endswith(f":{port}") or any(
                s in f for f in files for s in sessions
            ):
                ours.add(proc.pid)
    return ours - {os.getpid()}


def kill_cluster(port: int) -> None:
    """SIGKILL exactly this cluster's processes (``ray stop`` would take every Ray on the machine with it, other
    test sessions' included)."""
    for pid in cluster_pids(port):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Nodes:
    address: str
    """The head's GCS address, for ``run.ray_address``."""
    port: int
    """The GCS port, which names every process of the cluster (``kill_cluster``)."""
    dashboard: str | None
    """The head's job server (``http://127.0.0.1:<port>``) for ``ray job submit``; None without a dashboard."""


def head_args(port: int, dashboard_port: int | None) -> list[str]:
    """``ray start --head`` options: 2 logical CPUs, and every fixed default port (client server 10001, agent
    52365) moved to a free one, so that a second cluster on the machine cannot collide with this one."""
    dash = ["--include-dashboard=false"]
    if dashboard_port:
        dash = ["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"]
    return ["--head", f"--port={port}", f"--ray-client-server-port={free_port()}", *dash]


NODE = ["--disable-usage-stats", "--log-color=false"]  # plain text: the address is parsed


@contextlib.contextmanager
def head_node(cpus: int = 2, dashboard: bool = False) -> Iterator[Nodes]:
    """A head of ``cpus`` logical CPUs on this machine's node IP; the whole cluster killed on exit, even on
    failure (workers added with ``worker_node`` included)."""
    port = free_port()
    dashboard_port = free_port() if dashboard else None
    try:
        head = ray_cli(
            "start",
            *head_args(port, dashboard_port),
            f"--num-cpus={cpus}",
            *NODE,
            f"--dashboard-agent-listen-port={free_port()}",
        )
        address = next(
            line.split("--address=")[1].strip(" '\"") for line in head.splitlines() if "ray start --address=" in line
        )
        yield Nodes(address, port, f"http://127.0.0.1:{dashboard_port}" if dashboard_port else None)
    finally:
        kill_cluster(port)
        current = Path("/tmp/ray/ray_current_cluster")  # `ray start` records itself as the default address
        if current.exists() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()


@contextlib.contextmanager
def worker_node(address: str, cpus: int = 2) -> Iterator[Path]:
    """A worker of ``cpus`` logical CPUs joining ``address``; yields its temp dir (``kill_node`` ends it alone).

    The worker keeps its own temp dir, as a node on another machine does: in a shared one, its runtime-env agent
    would unpack a job's ``--working-dir`` over the head's copy, the directory the job's driver runs in."""
    tmp = Path(tempfile.mkdtemp(prefix="ray-worker-", dir="/tmp"))  # short: Ray's socket paths live under it
    try:
        agent = f"--dashboard-agent-listen-port={free_port()}"
        ray_cli("start", f"--address={address}", f"--num-cpus={cpus}", *NODE, agent, f"--temp-dir={tmp}")
        yield tmp
    finally:
        kill_node(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def kill_node(tmp: Path) -> int:
    """SIGKILL one worker node: the processes naming its temp dir and everything below them (its actors and
    their engines), as a spot node that goes away; returns how many were killed."""
    roots = [p for p in psutil.process_iter(["cmdline"]) if str(tmp) in " ".join(p.info["cmdline"] or [])]
    procs = {p.pid: p for root in roots for p in [root, *_descendants(root)]}
    for proc in procs.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return len(procs)


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return proc.children(recursive=True)
    return []


@contextlib.contextmanager
def two_nodes(dashboard: bool = False) -> Iterator[Nodes]:
    """Head and worker with 2 logical CPUs each, on this machine's node IP; killed on exit, even on failure."""
    with head_node(2, dashboard) as nodes, worker_node(nodes.address, 2):
        yield nodes
