"""Ray start-up and placement: which bundle each rollout replica and trainer rank runs in.

``separate``: one placement group, disjoint bundles for rollout replicas and trainer ranks.
``colocated``: one bundle per trainer rank; rollout replica i shares bundle i with trainer rank i and
each takes half of it (they take turns in sync mode, so the work is time-shared, not split).
With GPUs in the cluster a replica's bundle holds ``rollout.workers`` GPUs (tp x pp) and a rank's one.
On a multi-node cluster (``run.ray_address``, or the cluster a ``ray job submit`` runs on) Ray may put
bundles on different nodes; ``sync_config`` then switches host-local weight sync (shm, a private pull store) to
broadcast.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from relayrl import logs
from relayrl.config import WORKER_ENV, Config, PlacementConfig, RolloutConfig, TrainerConfig, WeightSyncConfig, has_cuda

logger = logging.getLogger(__name__)


@dataclass
class Placement:
    """Ray scheduling options for each actor, ready for ``.options(**opts)``."""

    group: PlacementGroup
    rollout: list[dict]  # one per replica
    trainer: list[dict]  # one per rank
    rollout_nodes: list[str] = dataclasses.field(default_factory=list)  # Ray node id of each replica's bundle
    trainer_nodes: list[str] = dataclasses.field(default_factory=list)


JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""Set by Ray's job supervisor, and by nothing else, in the environment of a ``ray job submit`` entrypoint
(beside ``RAY_ADDRESS``, the cluster's GCS address): how a run knows it was submitted as a Ray job."""


def cluster_to_join(address: str | None, env: Mapping[str, str]) -> tuple[str, str] | None:
    """The Ray cluster a run joins and why, or None for a new local Ray.

    ``run.ray_address`` when set; else, when this process is a Ray job's entrypoint, the cluster the job was
    submitted to, so ``ray job submit -- relayrl train ...`` needs no address. A cluster that ``ray start``
    left behind, or a ``RAY_ADDRESS`` exported in a shell, is never joined: a laptop run keeps its own Ray."""
    if address:
        return address, "run.ray_address"
    if JOB_CONFIG_ENV not in env:
        return None
    job = json.loads(env[JOB_CONFIG_ENV]).get("metadata", {}).get("job_submission_id", "?")
    return env.get("RAY_ADDRESS") or "auto", f"Ray job {job}"


def relative_output_dir(output_dir: str, address: str | None, env: Mapping[str, str]) -> str | None:
    """A warning when a run that joins a cluster (``cluster_to_join``) writes under a relative
    ``run.output_dir``: each process resolves it against its own current directory, which on another node,
    or in a Ray job's unpacked working directory, is not where the driver's run dir is. None otherwise."""
    join = cluster_to_join(address, env)
    if join is None or os.path.isabs(output_dir):
        return None
    return (
        f"relayrl: run.output_dir={output_dir} is relative and this run joins a Ray cluster ({join[1]}): the run "
        f"dir lands under {os.path.abspath(output_dir)} on the driver's node, and ranks on other nodes would "
        "write checkpoints under their own current directory; pass an absolute path that every node mounts"
    )


def start_ray(address: str | None, placement: PlacementConfig, needed_cpus: float) -> None:
    """Start (or join) Ray, bound to localhost. Logical CPUs may exceed cores: the sync loop time-shares them.
    Without ``address`` a new local Ray is started even if ``ray start`` left a cluster address behind
    (``address="local"``): a run joins a cluster only when told to (``cluster_to_join``).
    Worker output streams to the driver; a run's ``RunDir`` routes it into its ``logs/`` (``relayrl.logs``)."""
    if ray.is_initialized():
        return
    env = {"env_vars": dict(WORKER_ENV)}
    join = cluster_to_join(address, os.environ)
    if join:
        ray.init(address=join[0], runtime_env=env, log_to_driver=True)
        gcs = ray.get_runtime_context().gcs_address
        logger.info("relayrl: joined the Ray cluster at %s (%s): %s", gcs, join[1], cluster_size())
    else:
        cpus = placement.num_cpus or max(float(os.cpu_count() or 1), needed_cpus)
        ray.init(
            address="local",
            num_cpus=int(-(-cpus // 1)),
            include_dashboard=False,
            runtime_env=env,
            _node_ip_address="127.0.0.1",
            log_to_driver=True,
        )
    logs.attach()  # the run's router (if one is installed) takes Ray's printer off the console


def cluster_size() -> str:
    """What the joined cluster offers ("2 nodes, 4 CPUs, 0 GPUs"): the join line says which cluster it was."""
    res = ray.cluster_resources()
    nodes = sum(n["Alive"] for n in ray.nodes())
    return f"{nodes} nodes, {res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs"


def split_cores(cfg: Config, cores: int | None = None) -> Config:
    """``cfg`` with the host's cores shared out where async overlap needs it (CPU boxes only).

    ``num_threads=0`` means "every core", right for sync and colocated runs, where one phase runs at a
    time. ``mode=async`` with separate placement generates and trains at once, so every engine and every
    trainer rank taking all cores would oversubscribe them (each spinning OpenMP pool slows the other).
    There, each replica and rank left at 0 gets ``cores // (replicas + ranks)`` threads (at least 1); the
    engines bind the last cores (``rollout.actor.cpu_thread_env``), so the trainer keeps the first ones.
    Explicit thread counts are kept. ``rollout.pause_while_training`` never overlaps the two: no split."""
    if has_cuda() or cfg.mode != "async" or cfg.placement.mode != "separate" or cfg.rollout.pause_while_training:
        return cfg
    actors = cfg.rollout.num_replicas + cfg.trainer.world_size
    share = max(1, (cores or os.cpu_count() or 1) // actors)
    rollout = cfg.rollout if cfg.rollout.num_threads else dataclasses.replace(cfg.rollout, num_threads=share)
    trainer = cfg.trainer if cfg.trainer.num_threads else dataclasses.replace(cfg.trainer, num_threads=share)
    return dataclasses.replace(cfg, rollout=rollout, trainer=trainer)


SCORING_CPUS = 1.0
"""Logical CPUs left outside the placement group for reward scoring tasks."""


def needed_cpus(rollout: RolloutConfig, trainer: TrainerConfig, placement: PlacementConfig) -> float:
    """Logical CPUs the run asks Ray for: the placement group's bundles plus room for scoring tasks."""
    trainer_cpus = trainer.world_size * trainer.num_cpus
    if placement.mode == "colocated":
        return trainer_cpus + SCORING_CPUS
    return rollout.num_replicas * rollout.num_cpus + trainer_cpus + SCORING_CPUS


def make_placement(
    rollout: RolloutConfig,
    trainer: TrainerConfig,
    placement: PlacementConfig,
    timeout_s: float = 60.0,
    gpus: bool | None = None,
) -> Placement:
    """Reserve bundles and say where each actor goes; fails with a clear message if Ray lacks resources.

    ``gpus`` (default: the Ray cluster has GPUs): a rollout replica's bundle also holds
    ``rollout.workers`` GPUs (tp x pp: its vLLM workers run on them) and a trainer rank's one GPU; colocated,
    replica i and rank i each take half of bundle i's GPU.
    """
    gpus = ray.cluster_resources().get("GPU", 0) > 0 if gpus is None else gpus
    r_gpus: float  # halved when colocated
    t_gpus: float
    r_gpus, t_gpus = (rollout.workers, 1) if gpus else (0, 0)
    t_bundle = {"CPU": trainer.num_cpus, **({"GPU": t_gpus} if gpus else {})}
    if placement.mode == "separate":
        r_bundle = {"CPU": rollout.num_cpus, **({"GPU": r_gpus} if gpus else {})}
        bundles = [r_bundle] * rollout.num_replicas + [t_bundle] * trainer.world_size
        r_idx = list(range(rollout.num_replicas))
        t_idx = [rollout.num_replicas + i for i in range(trainer.world_size)]
        r_cpus, t_cpus = rollout.num_cpus, trainer.num_cpus
    else:
        bundles = [t_bundle] * trainer.world_size
        r_idx, t_idx = list(range(rollout.num_replicas)), list(range(trainer.world_size))
        r_cpus = t_cpus = trainer.num_cpus / 2
        r_gpus = t_gpus = t_gpus / 2
    pg = placement_group(bundles, strategy="PACK")
    if not pg.wait(timeout_seconds=timeout_s):
        raise RuntimeError(
            f"Ray could not reserve {bundles} within {timeout_s:.0f}s; "
            "lower rollout/trainer num_cpus (or rollout.tp_size) or set placement.num_cpus"
        )

    def opts(i: int, cpus: float, n_gpus: float) -> dict:
        strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
        return {"num_cpus": cpus, "scheduling_strategy": strategy, **({"num_gpus": n_gpus} if gpus else {})}

    nodes = ray.util.placement_group_table(pg)["bundles_to_node_id"]
    return Placement(
        pg,
        [opts(i, r_cpus, r_gpus) for i in r_idx],
        [opts(i, t_cpus, t_gpus) for i in t_idx],
        [nodes[i] for i in r_idx],
        [nodes[i] for i in t_idx],
    )


def sync_config(ws: WeightSyncConfig, placement: Placement) -> WeightSyncConfig:
    """The weight-sync settings this placement can use: ``shm``, and ``pull`` with its private store (no
    ``weightsync.pull_dir``), need every engine on trainer rank 0's node; when Ray put some elsewhere, fall back
    to ``broadcast`` with the store on rank 0's node IP. ``pull`` with a ``pull_dir`` is kept: that directory
    is the user's word that every node mounts it. ``pull_when=admission`` has no push to fall back to: a private
    store across nodes is refused in one line naming ``weightsync.pull_dir``."""
    host_local = ws.backend == "shm" or (ws.backend == "pull" and not ws.pull_dir)
    if not host_local or set(placement.rollout_nodes) <= {placement.trainer_nodes[0]}:
        return ws
    nodes = len(set(placement.rollout_nodes) | set(placement.trainer_nodes))
    if ws.pull_when == "admission":  # replicas fetch from the store themselves: no push to fall back to
        raise ValueError(
            f"weightsync.pull_when=admission with a private pull store (weightsync.pull_dir unset) needs every engine "
            f"on trainer rank 0's node, but the replicas span {nodes} nodes; set weightsync.pull_dir to a directory "
            "every node mounts"
        )
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    host = ips.get(placement.trainer_nodes[0], ws.host)
    logger.info(
        "relayrl: rollout replicas span %d nodes; weightsync.backend=%s -> broadcast (store on %s)",
        nodes,
        ws.backend,
        host,
    )
    return dataclasses.replace(ws, backend="broadcast", host=host)


def rollout_config(cfg: Config) -> RolloutConfig:
    """The rollout settings this mode can use: ``mode=async`` commits weights while requests run, when vLLM
    cannot empty its prefix cache, so it runs without ``prefix_sharing``."""
    if cfg.mode == "sync" or not cfg.rollout.prefix_sharing:
        return cfg.rollout
    return dataclasses.replace(cfg.rollout, prefix_sharing=False)
