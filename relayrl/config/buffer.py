"""The ``buffer`` section: how far ahead of the trainer rollout may run (``mode=async``)."""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.config.base import ConfigError


@dataclass
class BufferConfig:
    max_staleness: int = 1
    """mode=async: train on groups whose oldest token is at most this many versions old (k; 0 = on-policy).
    Rollout is paused (not thrown away) when it would run further ahead."""
    capacity: int | None = None
    """Most groups the buffer may hold (backpressure on rollout); None: bounded by max_staleness alone."""
    drop_stale: bool = False
    """Drop (and count) groups that exceed max_staleness instead of failing; admission control makes
    this a safety net, off by default."""

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ConfigError(f"buffer.max_staleness={self.max_staleness} must be >= 0 (0: on-policy)")
