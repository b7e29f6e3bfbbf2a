"""Ray start-up and placement: which bundle each rollout replica and trainer rank runs in.

``separate``: one placement group, disjoint bundles for rollout replicas and trainer ranks.
``colocated``: one bundle per trainer rank; rollout replica i shares bundle i with trainer rank i and
each takes half of it (they take turns in sync mode, so the work is time-shared, not split).
On a multi-node cluster (``run.ray_address``) Ray may put bundles on different nodes; ``sync_config``
then switches shared-memory weight sync to broadcast.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from relayrl.config import PlacementConfig, RolloutConfig, TrainerConfig, WeightSyncConfig


@dataclass
class Placement:
    """Ray scheduling options for each actor, ready for ``.options(**opts)``."""

    group: PlacementGroup
    rollout: list[dict]   # one per replica
    trainer: list[dict]   # one per rank
    rollout_nodes: list[str] = dataclasses.field(default_factory=list)   # Ray node id of each replica's bundle
    trainer_nodes: list[str] = dataclasses.field(default_factory=list)


def start_ray(address: str | None, placement: PlacementConfig, needed_cpus: float) -> None:
    """Start (or join) Ray, bound to localhost. Logical CPUs may exceed cores: the sync loop time-shares them.
    Without ``address`` a new local Ray is started even if ``ray start`` left a cluster address behind
    (``address="local"``): joining a cluster is always explicit (``run.ray_address``)."""
    if ray.is_initialized():
        return
    env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "WARNING"}}
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=True)
        return
    cpus = placement.num_cpus or max(float(os.cpu_count() or 1), needed_cpus)
    ray.init(address="local", num_cpus=int(-(-cpus // 1)), include_dashboard=False, runtime_env=env,
             _node_ip_address="127.0.0.1", log_to_driver=True)


SCORING_CPUS = 1.0
"""Logical CPUs left outside the placement group for reward scoring tasks."""


def needed_cpus(rollout: RolloutConfig, trainer: TrainerConfig, placement: PlacementConfig) -> float:
    """Logical CPUs the run asks Ray for: the placement group's bundles plus room for scoring tasks."""
    trainer_cpus = trainer.world_size * trainer.num_cpus
    if placement.mode == "colocated":
        return trainer_cpus + SCORING_CPUS
    return rollout.num_replicas * rollout.num_cpus + trainer_cpus + SCORING_CPUS


def make_placement(rollout: RolloutConfig, trainer: TrainerConfig, placement: PlacementConfig,
                   timeout_s: float = 60.0) -> Placement:
    """Reserve bundles and say where each actor goes; fails with a clear message if Ray lacks CPUs."""
    if placement.mode == "separate":
        bundles = [{"CPU": rollout.num_cpus}] * rollout.num_replicas + [{"CPU": trainer.num_cpus}] * trainer.world_size
        r_idx = list(range(rollout.num_replicas))
        t_idx = [rollout.num_replicas + i for i in range(trainer.world_size)]
        r_cpus, t_cpus = rollout.num_cpus, trainer.num_cpus
    else:
        bundles = [{"CPU": trainer.num_cpus}] * trainer.world_size
        r_idx, t_idx = list(range(rollout.num_replicas)), list(range(trainer.world_size))
        r_cpus = t_cpus = trainer.num_cpus / 2
    pg = placement_group(bundles, strategy="PACK")
    if not pg.wait(timeout_seconds=timeout_s):
        raise RuntimeError(f"Ray could not reserve {bundles} within {timeout_s:.0f}s; "
                           "lower rollout/trainer num_cpus or set placement.num_cpus")

    def opts(i: int, cpus: float) -> dict:
        strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
        return {"num_cpus": cpus, "scheduling_strategy": strategy}

    nodes = ray.util.placement_group_table(pg)["bundles_to_node_id"]
    return Placement(pg, [opts(i, r_cpus) for i in r_idx], [opts(i, t_cpus) for i in t_idx],
                     [nodes[i] for i in r_idx], [nodes[i] for i in t_idx])


def sync_config(ws: WeightSyncConfig, placement: Placement) -> WeightSyncConfig:
    """The weight-sync settings this placement can use: ``shm`` needs every engine on trainer rank 0's
    node; when Ray put some elsewhere, fall back to ``broadcast`` with the store on rank 0's node IP."""
    if ws.backend != "shm" or set(placement.rollout_nodes) <= {placement.trainer_nodes[0]}:
        return ws
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    host = ips.get(placement.trainer_nodes[0], ws.host)
    print(f"relayrl: rollout replicas span {len(set(placement.rollout_nodes) | set(placement.trainer_nodes))} "
          f"nodes; weightsync.backend=shm -> broadcast (store on {host})")
    return dataclasses.replace(ws, backend="broadcast", host=host)
