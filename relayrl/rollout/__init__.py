"""Rollout: vLLM engines in Ray actors producing version-tagged trajectory groups."""

from relayrl.rollout.actor import RolloutActor, start_rollout_actor
from relayrl.rollout.cleanup import cleanup_engine_segments

__all__ = ["RolloutActor", "cleanup_engine_segments", "start_rollout_actor"]
