"""Driver-side handle on the trainer ranks: start them, fan every call out to all, return rank 0's answer.

Every ``TrainerActor`` method is a collective, so each call here goes to all ranks at once; ranks
return identical stats (train_step) or their share of a collective (state_dict: only rank 0 has it).
"""

from __future__ import annotations

from typing import Any

import ray

from relayrl.config import (
    AlgorithmConfig,
    CriticConfig,
    ModelConfig,
    TrainerConfig,
    WeightSyncConfig,
    malloc_env,
    with_env,
)
from relayrl.trainer import recompute
from relayrl.trainer.actor import TrainerActor, resolve_backend


def rendezvous_host(rank0_options: dict[str, Any], world_size: int) -> str:
    """The address torch.distributed's store listens on: 127.0.0.1 when Ray has one node or there is one
    rank, else rank 0's node IP (asked of a zero-CPU task scheduled as rank 0 will be)."""
    if world_size == 1 or len([n for n in ray.nodes() if n["Alive"]]) == 1:
        return "127.0.0.1"
    where = {k: v for k, v in rank0_options.items() if k == "scheduling_strategy"}
    return ray.get(ray.remote(ray.util.get_node_ip_address).options(num_cpus=0, **where).remote())


class TrainerGroup:
    """``world_size`` trainer ranks as Ray actors in one torch.distributed group.

    ``actor_options``: Ray ``.options(...)`` for the ranks, one dict shared by all or one per rank
    (e.g. ``scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r)``),
    merged over the defaults ``num_cpus=trainer_cfg.num_cpus`` (+ ``num_gpus=1`` for nccl). The
    rendezvous is rank 0's node (found by a task placed like rank 0), so ranks that a placement group
    spreads over several nodes still find each other; rank 0 binds a port the OS picks (``listen``) and
    the others receive it through Ray. (A port found free by the driver and bound by rank 0 seconds later
    can be taken in between: Ray's and vLLM's sockets take ephemeral ports all through the start.)

    With ``algo_cfg.name=gae`` (PPO) every rank also holds its shard of the critic (``critic.py``), trained
    with ``critic_cfg`` in the same ``train_step``.

    Construction starts ``setup`` on every rank without waiting (model loading can overlap with engine
    start); ``ready()`` waits, and every other method calls it first.
    """

    def __init__(
        self,
        world_size: int,
        model_path: str,
        model_cfg: ModelConfig,
        trainer_cfg: TrainerConfig,
        algo_cfg: AlgorithmConfig,
        temperature: float = 1.0,
        seed: int = 0,
        actor_options: dict[str, Any] | list[dict[str, Any]] | None = None,
        timeout_s: float = 600.0,
        critic_cfg: CriticConfig | None = None,
    ):
        long_rows = recompute.rank_rows_are_long(model_path, trainer_cfg, model_cfg, world_size)
        per_rank = self._options(world_size, trainer_cfg, actor_options, long_rows)
        host = rendezvous_host(per_rank[0], world_size)
        remote_cls = ray.remote(TrainerActor)
        self.actors = [
            remote_cls.options(**per_rank[rank]).remote(
                rank,
                world_size,
                host,
                0,
                model_path,
                model_cfg,
                trainer_cfg,
                algo_cfg,
                temperature,
                seed,
                timeout_s,
                critic_cfg,
            )
            for rank in range(world_size)
        ]
        # Ray types a handle's methods as the class's plain functions, without the .remote it adds
        port = self.actors[0].listen.remote()  # type: ignore[attr-defined]  # Ray adds .remote
        self._setup_refs: list | None = [a.setup.remote(port) for a in self.actors]  # type: ignore[attr-defined]  # Ray adds .remote

    @staticmethod
    def _options(
        world_size: int,
        cfg: TrainerConfig,
        actor_options: dict[str, Any] | list[dict[str, Any]] | None,
        long_rows: bool = False,
    ) -> list[dict[str, Any]]:
        """Each rank's Ray options; on a CPU host the malloc settings its micro-batches call for
        (``config.runtime.malloc_env``: glibc's defaults for long rows)."""
        defaults: dict[str, Any] = {"num_cpus": cfg.num_cpus}
        if resolve_backend(cfg.backend) == "nccl":
            defaults["num_gpus"] = 1
        if actor_options is None or isinstance(actor_options, dict):
            actor_options = [actor_options or {}] * world_size
        if len(actor_options) != world_size:
            raise ValueError(
                f"actor_options has {len(actor_options)} entries for world_size={world_size}; "
                "pass one dict per rank or a single dict for all"
            )
        return [with_env({**defaults, **opts}, malloc_env(long_rows)) for opts in actor_options]

    def ready(self) -> None:
        """Wait until every rank has joined the process group and sharded its model."""
        if self._setup_refs is not None:
            ray.get(self._setup_refs)
            self._setup_refs = None

    def _all(self, method: str, *args: Any) -> list[Any]:
        self.ready()
        return ray.get([getattr(a, method).remote(*args) for a in self.actors])

    def train_step(self, group_refs: list) -> dict[str, float]:
        """One step on ``group_refs`` (ObjectRefs of ``list[TrajectoryGroup]``, passed inside a list so
        Ray hands them to the ranks unresolved); returns the stats, identical on all ranks."""
        return self._all("train_step", group_refs)[0]

    def train_step_async(self, group_refs: list) -> list[ray.ObjectRef]:
        """``train_step`` without waiting: one ref per rank (all return the same stats)."""
        self.ready()
        return [a.train_step.remote(group_refs) for a in self.actors]  # type: ignore[attr-defined]  # Ray adds .remote

    def state_dict(self) -> dict:
        """Full CPU state dict with HF names, pulled to the caller (use ``state_dict_ref`` to avoid that)."""
        return self._all("state_dict")[0]

    def state_dict_ref(self) -> ray.ObjectRef:
        """Rank 0's full state dict as an ObjectRef, after all ranks finished the gather."""
        self.ready()
        refs = [a.state_dict.remote() for a in self.actors]  # type: ignore[attr-defined]  # Ray adds .remote
        ray.wait(refs, num_returns=len(refs), fetch_local=False)
        return refs[0]

    def critic_state_dict(self) -> dict:
        """The critic's full CPU state dict (PPO only), pulled to the caller."""
        return self._all("critic_state_dict")[0]

    def connect_rollouts(self, ws_cfg: WeightSyncConfig, rollouts: list) -> None:
        """Tell every rank which engines its syncs go to (the ranks ask the engines what else they need)."""
        self._all("connect_rollouts", ws_cfg, list(rollouts))

    def sync_weights(self, version: int) -> dict[str, float]:
        """Gather and send the weights to every engine as ``version`` (a transaction); rank 0's metrics."""
        return self._all("sync_weights", version)[0]

    def save_checkpoint(self, path: str, asynchronous: bool = False) -> float:
        """Every rank writes its shards (DCP) and RNG under ``path`` (one shared directory); with
        ``asynchronous`` the ranks return once staged and write in the background. Returns the longest
        stall of any rank (seconds)."""
        return max(self._all("save_checkpoint", str(path), asynchronous))

    def checkpoint_written(self, wait: bool = False) -> bool:
        """Whether every rank's last checkpoint write is on disk (``wait``: block until it is)."""
        return all(self._all("checkpoint_written", wait))

    def load_checkpoint(self, path: str) -> None:
        self._all("load_checkpoint", str(path))

    def save_hf(self, out_dir: str) -> str:
        """Write an HF model directory (loadable by transformers and vLLM); returns its path."""
        return self._all("save_hf", str(out_dir))[0]

    def param_counts(self) -> tuple[int, int]:
        """(trainable, total) parameters of the policy (with ``trainer.lora``: trainable = the adapters)."""
        return tuple(self._all("param_counts")[0])

    def held_parameters(self) -> list[dict[str, int]]:
        """Each rank's policy weights, by name, with the elements it keeps of each: all of them (FSDP2: its shard of
        each), or under ``trainer.pp_size`` its stages' (with dp replicas, its shard of their decoder layers)."""
        return self._all("held_parameters")

    def sequence_logprobs(self, token_ids: list[int], temperature: float | None = None) -> list[float]:
        return self._all("sequence_logprobs", list(token_ids), temperature)[0]

    def probe(self, group_refs: list, samples: int) -> tuple[list[list[int]], list[int], list[list[float]]]:
        """Token ids, completion starts and trainer logprobs of the first ``samples`` trajectories of
        ``group_refs`` (the ranks fetch them: the driver passes refs only)."""
        return self._all("probe", list(group_refs), samples)[0]

    def offload(self) -> float:
        """Colocated GPUs: every rank's training state to host memory; bytes moved per rank (CPU: 0)."""
        return self._all("offload")[0]

    def onload(self) -> float:
        """Every rank's training state back onto its GPU; bytes moved per rank (CPU: 0)."""
        return self._all("onload")[0]

    def dead_ranks(self, timeout_s: float = 30.0) -> list[int]:
        """Ranks whose actor process is gone (a survivor stuck in a collective still counts as alive)."""
        refs = [a.__ray_ready__.remote() for a in self.actors]  # type: ignore[union-attr]  # a handle, not the class
        dead = []
        for rank, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=timeout_s)
            except ray.exceptions.RayActorError:
                dead.append(rank)
            except ray.exceptions.GetTimeoutError:
                pass
        return dead

    def shutdown(self) -> None:
        """Leave the process group on every rank (best effort: a dead rank cannot), then end the actors."""
        try:
            ray.get([a.close.remote() for a in self.actors], timeout=60)  # type: ignore[attr-defined]  # Ray adds .remote
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError):
            pass
        finally:
            for a in self.actors:
                ray.kill(a)  # type: ignore[arg-type]  # a handle: Ray types .remote() as handle | class
            self.actors = []
