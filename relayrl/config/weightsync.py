"""The ``weightsync`` section: how new weights reach the engines, and how a sync is verified."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from relayrl.config.base import ConfigError, choices_of, one_of, positive
from relayrl.config.runtime import has_cuda

SyncBackend = Literal["shm", "broadcast", "pull", "vllm-native"]
"""Values of ``weightsync.backend``, a ``str`` field checked against them (``base`` says why)."""
NativeEngine = Literal["nccl", "ipc"]
"""``weightsync.native_engine`` values."""
CommitMode = Literal["inplace", "reload"]
"""``weightsync.commit`` values."""
PullWhen = Literal["sync", "admission"]
"""``weightsync.pull_when`` values."""


@dataclass
class WeightSyncConfig:
    backend: str = "shm"
    """How new weights reach engines: shm (one flat buffer in /dev/shm that every engine maps; one host),
    broadcast (gloo broadcast of flat buckets; any host), pull (the trainer publishes each version once to a
    directory, ``pull_dir``, and every engine fetches and checks it; any host that mounts it), vllm-native
    (vLLM's own nccl/ipc engines; GPU)."""
    native_engine: str = "nccl"
    """vllm-native only: nccl (trainer and engines on different GPUs) or ipc (same GPU, colocated)."""
    bucket_mb: int = 64
    """Bucket size: the trainer gathers, packs and sends this much at a time (its extra memory per sync)."""
    shm_dir: str = "/dev/shm"
    """Directory for the shm backend's buffer (must exist; tmpfs such as /dev/shm keeps it in memory)."""
    pull_dir: str = ""
    """pull only: the versioned store, ``<pull_dir>/v<version>/{payload.bin, manifest.json}``. Empty: a private
    directory the trainer makes in /dev/shm (one host) and removes when the transfer closes. For engines on other
    hosts, an absolute path every trainer and engine host mounts (NFS, a mounted bucket), one trainer per path;
    it must exist."""
    pull_keep: int = 2
    """pull only: versions the store keeps, the newest included; older ones are removed after each publish."""
    pull_when: str = "sync"
    """pull only: when an engine fetches a version. sync: every engine fetches it inside the step's sync
    transaction (as a push lands). admission: the step's sync only publishes; a replica fetches the newest
    version when it is given a call that needs it, before generating (a replica that no call reaches never
    fetches). With ``mode=sync`` that is Echo's sequential pull mode: each replica refreshes before each call."""
    host: str = "127.0.0.1"
    """Address the trainer's rendezvous store binds (broadcast / vllm-native); a routable IP for multi-node."""
    timeout_s: float = 120.0
    """Deadline for each stage of a sync (start, transfer, commit); on expiry the sync aborts and engines
    keep serving the previous version."""
    verify_every: int = 10
    """Every N syncs, score a probe batch in the engine and the trainer and compare logprobs (0: never)."""
    verify_samples: int = 2
    """Completions in the probe batch."""
    max_mismatch: float = 0.05
    """Fail the run when the probe's mean |logprob(engine) - logprob(trainer)| exceeds this (nats/token)."""
    commit: str = "inplace"
    """How an engine loads a verified version (``weightsync/commit.py``): inplace (copy into the parameters it
    has and rebuild the CPU GEMM copies; on CPU a linear whose tensors lie end to end in the payload is
    packed straight from it, without the copy) or
    reload (vLLM's reload_weights: re-allocates and re-processes every layer; slower, handles quantized
    models). Only relayrl's backends (shm, broadcast, pull) use it; vllm-native loads in place itself."""

    def __post_init__(self) -> None:
        one_of("weightsync.backend", self.backend, SyncBackend)
        if self.backend == "vllm-native" and not has_cuda():
            raise ConfigError(
                "weightsync.backend=vllm-native runs vLLM's nccl/ipc engines, which need GPUs; "
                "on CPU use weightsync.backend=shm (one host) or broadcast"
            )
        one_of("weightsync.native_engine", self.native_engine, NativeEngine)
        positive("weightsync", self, "timeout_s", "bucket_mb", "verify_samples", "max_mismatch", "pull_keep")
        if self.pull_dir and not os.path.isabs(self.pull_dir):
            raise ConfigError(
                f"weightsync.pull_dir={self.pull_dir} is relative, and each trainer and engine process would resolve "
                "it from its own working directory; pass an absolute path (or leave it empty for a private store)"
            )
        one_of("weightsync.pull_when", self.pull_when, PullWhen)
        if self.pull_when != "sync" and self.backend != "pull":
            raise ConfigError(
                f"weightsync.pull_when={self.pull_when} is for engines that fetch from a store; "
                "set weightsync.backend=pull, or leave pull_when=sync"
            )
        if self.verify_every < 0:
            raise ConfigError(f"weightsync.verify_every={self.verify_every} must be >= 0 (0: never)")
        if self.commit not in choices_of(CommitMode):
            raise ConfigError(f"weightsync.commit={self.commit!r} is not supported; use inplace or reload")
