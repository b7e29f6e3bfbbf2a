"""Versioned weight sync from trainer ranks to vLLM engines: one interface, backends in one registry.

Each backend is a pair of vLLM weight-transfer engines (``relayrl.weightsync.base`` explains the
shape and the transaction relayrl adds) plus how to build its trainer-side init info:

=============  ==============================  ==============================================
backend        vLLM engine (worker side)       what moves the bytes
=============  ==============================  ==============================================
shm            relayrl (transport shm)         one flat buffer in /dev/shm, mapped by engines
broadcast      relayrl (transport broadcast)   gloo broadcast of flat buckets (CPU, any host)
pull           relayrl (transport pull)        a versioned store in a directory (any host mounting it)
vllm-native    nccl | ipc (weightsync.native)  vLLM's own engines, for GPU users
=============  ==============================  ==============================================

Trainer side: ``TrainerSync`` (``relayrl.weightsync.sync``). Engine side: ``engine_config(cfg)``
goes into the engine args, and ``RolloutActor`` exposes the control-plane calls. Where each engine
class lives, by name, is in ``relayrl.weightsync.names``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relayrl.config import WeightSyncConfig
from relayrl.weightsync.names import TRAINER_ENGINES, WORKER_ENGINES


@dataclass(frozen=True)
class Backend:
    engine: Callable[[WeightSyncConfig], str]  # vLLM engine name for this config
    trainer_info: Callable[[WeightSyncConfig, int, int, str | None], Any]  # (cfg, rank, workers, wire dtype)


def _shm_info(cfg: WeightSyncConfig, rank: int, workers: int, wire_dtype: str | None) -> Any:
    from relayrl.weightsync.shm import ShmTrainerInitInfo

    return ShmTrainerInitInfo(rank=rank, shm_dir=cfg.shm_dir, bucket_bytes=cfg.bucket_mb << 20, wire_dtype=wire_dtype)


def _broadcast_info(cfg: WeightSyncConfig, rank: int, workers: int, wire_dtype: str | None) -> Any:
    from relayrl.weightsync.broadcast import BroadcastTrainerInitInfo

    return BroadcastTrainerInitInfo(
        rank=rank,
        world_size=1 + workers,
        host=cfg.host,
        bucket_bytes=cfg.bucket_mb << 20,
        wire_dtype=wire_dtype,
        timeout_s=cfg.timeout_s,
    )


def _pull_info(cfg: WeightSyncConfig, rank: int, workers: int, wire_dtype: str | None) -> Any:
    from relayrl.weightsync.pull import PullTrainerInitInfo

    return PullTrainerInitInfo(
        rank=rank,
        pull_dir=cfg.pull_dir,
        keep=cfg.pull_keep,
        bucket_bytes=cfg.bucket_mb << 20,
        wire_dtype=wire_dtype,
        publish_only=cfg.pull_when == "admission",
    )


def _native_info(cfg: WeightSyncConfig, rank: int, workers: int, wire_dtype: str | None) -> Any:
    """vLLM's NCCL (separate GPUs) or CUDA-IPC (same GPU) engine; vLLM sends in the trainer's dtype."""
    if cfg.native_engine == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=cfg.bucket_mb << 20)
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    from relayrl.rendezvous import free_port  # imports torch, which the rollout actor never loads

    return NCCLTrainerInitInfo(
        rank=rank,
        master_address=cfg.host,
        master_port=free_port(cfg.host),
        world_size=1 + workers,
        packed=True,
        packed_buffer_size_bytes=cfg.bucket_mb << 20,
    )


BACKENDS: dict[str, Backend] = {
    "shm": Backend(lambda cfg: "relayrl", _shm_info),
    "broadcast": Backend(lambda cfg: "relayrl", _broadcast_info),
    "pull": Backend(lambda cfg: "relayrl", _pull_info),
    "vllm-native": Backend(lambda cfg: cfg.native_engine, _native_info),
}


def register_with_vllm() -> None:
    """Add relayrl's engines to vLLM's two factories (idempotent; lazy imports, like vLLM's own)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    for factory, engines in (
        (WeightTransferEngineFactory, WORKER_ENGINES),
        (WeightTransferTrainerFactory, TRAINER_ENGINES),
    ):
        for name, (module, cls_name) in engines.items():
            with contextlib.suppress(ValueError):  # already registered in this process
                factory.register_engine(name, module, cls_name)


def engine_config(cfg: WeightSyncConfig) -> Any:
    """vLLM's ``WeightTransferConfig`` for the engine args of every rollout engine."""
    from vllm.config.weight_transfer import WeightTransferConfig

    return WeightTransferConfig(backend=BACKENDS[cfg.backend].engine(cfg))


__all__ = ["BACKENDS", "Backend", "engine_config", "register_with_vllm"]
