"""``split_cores``: async on a CPU box shares the cores between engines and trainer ranks; nothing else changes."""

from __future__ import annotations

import pytest

from relayrl.config import WeightSyncConfig, load_config
from relayrl.controller import cluster
from relayrl.controller.cluster import split_cores


def threads(overrides: list[str], cores: int) -> tuple[int, int]:
    cfg = split_cores(load_config("grpo_arith", overrides), cores=cores)
    return cfg.rollout.num_threads, cfg.trainer.num_threads


@pytest.mark.parametrize(
    "overrides, cores, expected",
    [
        (["mode=async"], 2, (1, 1)),  # 2 cores // (1 + 1)
        (["mode=async", "rollout.num_replicas=2", "trainer.world_size=2"], 16, (4, 4)),  # 16 // 4
        (["mode=async", "trainer.world_size=2"], 2, (1, 1)),  # 2 // 3 = 0 -> at least 1
        (["mode=async", "trainer.num_threads=2"], 16, (8, 2)),  # an explicit count is kept
        (["mode=sync"], 2, (0, 0)),  # one phase at a time: every core
        (["mode=async", "placement=colocated"], 2, (0, 0)),  # colocated never overlaps
    ],
)
def test_split_cores(overrides, cores, expected):
    assert threads(overrides, cores) == expected


def test_split_cores_leaves_gpu_runs_alone(monkeypatch):
    monkeypatch.setattr(cluster, "has_cuda", lambda: True)
    assert threads(["mode=async"], 2) == (0, 0)


@pytest.mark.parametrize(
    "overrides, sharing",
    [
        ([], True),  # sync: every commit finds no request running
        (["mode=async"], False),  # async commits mid-generation: no prefix cache
        (["rollout.prefix_sharing=false"], False),
    ],
)
def test_rollout_config_shares_prompts_only_in_sync_runs(overrides, sharing):
    cfg = load_config("grpo_tiny", overrides)
    assert cluster.rollout_config(cfg).prefix_sharing is sharing


JOB_ENV = {  # what Ray's job supervisor hands a `ray job submit` entrypoint (Ray 2.60)
    "RAY_ADDRESS": "10.0.0.5:6379",
    cluster.JOB_CONFIG_ENV: '{"runtime_env": {}, "metadata": {"job_submission_id": "raysubmit_abc"}}',
}


@pytest.mark.parametrize(
    "address, env, expected",
    [
        (None, {}, None),  # a plain run: its own local Ray, whatever `ray start` left behind
        (None, {"RAY_ADDRESS": "10.0.0.5:6379"}, None),  # an address exported in a shell is not a request to join
        ("10.0.0.7:6379", {}, ("10.0.0.7:6379", "run.ray_address")),
        (None, JOB_ENV, ("10.0.0.5:6379", "Ray job raysubmit_abc")),  # a Ray job joins the cluster it runs on
        ("10.0.0.7:6379", JOB_ENV, ("10.0.0.7:6379", "run.ray_address")),  # an explicit address wins
    ],
)
def test_cluster_to_join(address, env, expected):
    assert cluster.cluster_to_join(address, env) == expected


@pytest.mark.parametrize(
    "output_dir, address, env, warned",
    [
        ("runs", None, {}, False),  # a local run: relative to where it was launched, as always
        ("/shared/runs", None, JOB_ENV, False),
        ("runs", None, JOB_ENV, True),  # a Ray job: relative to Ray's unpacked working directory
        ("runs", "10.0.0.7:6379", {}, True),
    ],
)
def test_a_relative_output_dir_on_a_cluster_is_warned_about(output_dir, address, env, warned):
    warning = cluster.relative_output_dir(output_dir, address, env) or ""
    assert bool(warning) == warned
    if warned:
        assert "run.output_dir=runs is relative" in warning and "absolute path" in warning


@pytest.mark.parametrize(
    "backend, pull_dir, nodes, expected",
    [
        ("shm", "", ["a"], "shm"),  # every engine on rank 0's node
        ("shm", "", ["a", "b"], "broadcast"),
        ("pull", "", ["a"], "pull"),
        ("pull", "", ["a", "b"], "broadcast"),  # the private store is in rank 0's /dev/shm
        ("pull", "/mnt/store", ["a", "b"], "pull"),  # a pull_dir is the user's word that every node mounts it
        ("broadcast", "", ["a", "b"], "broadcast"),
    ],
)
def test_sync_config_keeps_a_backend_only_where_it_reaches_every_engine(
    monkeypatch, backend, pull_dir, nodes, expected
):
    monkeypatch.setattr(cluster.ray, "nodes", lambda: [{"NodeID": "a", "NodeManagerAddress": "10.0.0.1"}])
    placement = cluster.Placement(None, [], [], rollout_nodes=nodes, trainer_nodes=["a"])  # type: ignore[arg-type]
    ws = cluster.sync_config(WeightSyncConfig(backend=backend, pull_dir=pull_dir), placement)
    assert ws.backend == expected
    assert ws.host == ("10.0.0.1" if expected != backend else "127.0.0.1")


def test_sync_config_refuses_a_private_store_across_nodes_when_replicas_fetch_themselves(monkeypatch):
    """``pull_when=admission`` with no ``pull_dir``: replicas on another node could never reach the store, and there
    is no push to fall back to; one line names the fix. One node, or a pull_dir every node mounts, are kept."""
    monkeypatch.setattr(cluster.ray, "nodes", lambda: [{"NodeID": "a", "NodeManagerAddress": "10.0.0.1"}])
    two = cluster.Placement(None, [], [], rollout_nodes=["a", "b"], trainer_nodes=["a"])  # type: ignore[arg-type]
    one = cluster.Placement(None, [], [], rollout_nodes=["a"], trainer_nodes=["a"])  # type: ignore[arg-type]
    lazy = WeightSyncConfig(backend="pull", pull_when="admission")
    with pytest.raises(ValueError, match=r"replicas span 2 nodes; set weightsync\.pull_dir") as err:
        cluster.sync_config(lazy, two)
    assert "\n" not in str(err.value)
    assert cluster.sync_config(lazy, one) is lazy
    shared = WeightSyncConfig(backend="pull", pull_when="admission", pull_dir="/shared/weights")
    assert cluster.sync_config(shared, two) is shared
