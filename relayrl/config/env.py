"""The ``env`` section: multi-turn episodes against an environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relayrl.config.base import ConfigError


@dataclass
class EnvConfig:
    """Multi-turn episodes against an environment (``relayrl.envs``); unset, each sample is one completion."""

    name: str | None = None
    """A built-in environment (``relayrl.envs.ENVIRONMENTS``: calculator, python, retrieval) or an import path
    ``module:Class``; None: single-turn generation. Pair it with the ``env_reward`` reward to train on the
    episode's reward."""
    max_turns: int = 4
    """Most model turns per episode (each up to rollout.max_tokens tokens); environment turns go between."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Arguments for the environment's constructor (one instance per episode), e.g. a ``ToolEnv``'s
    ``tool_timeout_s`` (each tool call's limit, 10 s) or ``max_result_chars``."""
    episode_timeout_s: float | None = None
    """Wall-clock limit of one episode: past it no new turn starts, a running environment call is abandoned,
    and the episode ends as it stands (``env/timeout_frac``). None: no limit."""

    def __post_init__(self) -> None:
        """``name`` must load (built-in or importable ``module:Class``)."""
        if self.name is None:
            return
        if self.max_turns < 1:
            raise ConfigError(f"env.max_turns={self.max_turns} must be >= 1; set env.max_turns=4")
        if self.episode_timeout_s is not None and self.episode_timeout_s <= 0:
            raise ConfigError(
                f"env.episode_timeout_s={self.episode_timeout_s} must be > 0; set it to seconds or null (no limit)"
            )
        from relayrl.envs import env_factory

        try:
            env_factory(self.name, self.kwargs)
        except ValueError as exc:
            raise ConfigError(f"env.name: {exc}") from None
