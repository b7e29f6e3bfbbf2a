"""Rollout: vLLM engines in Ray actors producing version-tagged trajectory groups."""

from relayrl.rollout.actor import RolloutActor, start_rollout_actor

__all__ = ["RolloutActor", "start_rollout_actor"]
