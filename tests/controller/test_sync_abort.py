"""One abort path: when the trainer's sync fails, the driver tells every engine to abort through
``weightsync.client.abort_update`` (best effort), and the sync's own error is the one that surfaces."""

from __future__ import annotations

import pytest

from relayrl.config import load_config
from relayrl.controller.system import System


class Engine:
    """Stands in for a RolloutActor: records the aborts it is told."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def abort_weight_update(self, reason: str) -> None:
        self.reasons.append(reason)

    def told(self) -> list[str]:
        return self.reasons


class FailingTrainer:
    def sync_weights(self, version: int) -> dict:
        raise RuntimeError(f"rank 0: v{version} transfer timed out")


def test_failed_sync_aborts_live_engines_and_a_dead_one_does_not_mask_the_error(ray_session):
    engine = ray_session.remote(Engine)
    live, dead = engine.remote(), engine.remote()
    ray_session.get(dead.told.remote())
    ray_session.kill(dead)
    system = System(load_config("grpo_tiny", ["weightsync.timeout_s=5"]), None, [live, dead], FailingTrainer(), None)
    with pytest.raises(RuntimeError, match="v3 transfer timed out"):
        system.sync_weights(3)
    assert ray_session.get(live.told.remote()) == ["trainer-side sync failed"]
