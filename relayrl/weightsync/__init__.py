"""Versioned weight sync from trainer to vLLM engines: one interface, backends in one registry.

Trainer side: ``sender = make_sender(cfg); handle = sender.send(state_dict, version)``.
Engine side: ``WeightSyncExtension`` (``relayrl.weightsync.worker``) is mixed into each vLLM worker
and loads from the handle; ``RolloutActor.update_weights(handle, version)`` drives it.
"""

from __future__ import annotations

from pathlib import Path

from relayrl.config import WeightSyncConfig
from relayrl.weightsync.base import WeightHandle, WeightSender
from relayrl.weightsync.shm import ShmSender

BACKENDS: dict[str, type[WeightSender]] = {
    "shm": ShmSender,
}


def make_sender(cfg: WeightSyncConfig, fallback_dir: str | None = None) -> WeightSender:
    """Build the configured sender; ``shm`` uses ``fallback_dir`` when ``cfg.shm_dir`` does not exist."""
    if cfg.backend not in BACKENDS:
        raise ValueError(f"weightsync.backend={cfg.backend!r} is unknown; use one of {', '.join(BACKENDS)}")
    if cfg.backend == "shm":
        shm_dir = cfg.shm_dir if Path(cfg.shm_dir).is_dir() or fallback_dir is None else fallback_dir
        return ShmSender(shm_dir)
    return BACKENDS[cfg.backend]()


__all__ = ["BACKENDS", "ShmSender", "WeightHandle", "WeightSender", "make_sender"]
