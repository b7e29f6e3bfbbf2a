"""The ``rewards`` list (which functions score a completion, with their weights) and the ``reward``
section (how they run: worker pool, timeouts, the code sandbox)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relayrl.config.base import ConfigError, one_of, positive


@dataclass
class RewardSpec:
    fn: str = "relayrl.rewards.builtin:last_number_correct"
    """A built-in name (``relayrl.rewards.REWARDS``) or an import path ``module:function`` of a reward
    ``fn(prompts, completions, **columns) -> list[float | None]`` (sync or ``async def``)."""
    weight: float = 1.0
    """Weight of this function in the total reward."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Arguments for ``fn``: a class (e.g. ``reward_model``) is constructed with them and the instance is the
    reward; a function gets them bound as keyword arguments (``{pattern: ..., max_chars: ...}``)."""


@dataclass
class RewardConfig:
    """How reward functions run: in a pool of Ray workers, off the training loop, each call under a timeout."""

    timeout_s: float = 60.0
    """Wall seconds one reward call (one function on ``groups_per_call`` groups) may take; a slower call's
    worker process is killed and its completions are excluded from training (``reward/errors/timeout``)."""
    max_error_rate: float = 0.25
    """Abort the run when more than this fraction of a step's completions could not be scored (a function
    raised, timed out, or returned NaN/inf, a non-number or the wrong number of values)."""
    num_workers: int = 2
    """Reward worker processes (Ray actors); sync functions run one call at a time per worker, async ones
    concurrently."""
    groups_per_call: int = 1
    """Prompt groups (of G completions each) per reward call: a failure excludes one call's completions,
    so 1 confines it to one prompt; more amortises per-call overhead (e.g. a reward model's batches)."""
    sandbox: str = "auto"
    """How ``code_exec`` isolates programs (docs/rewards.md): auto (full isolation: namespaces and an
    allowlist root; where the host cannot, loading a ``code_exec`` reward fails before anything starts)
    | rlimits (weaker isolation, accepted knowingly; logged as ``reward/sandbox_isolation`` 1)."""

    def __post_init__(self) -> None:
        positive("reward", self, "timeout_s", "num_workers", "groups_per_call")
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise ConfigError(
                f"reward.max_error_rate={self.max_error_rate} must be in [0, 1]; "
                "set reward.max_error_rate=0.25 (1.0 never aborts)"
            )
        self._check_sandbox()

    def _check_sandbox(self) -> None:
        """The one place ``reward.sandbox``'s value is checked: a mode of ``rewards.sandbox.MODES`` (the
        sandbox owns its modes). Whether this host gives ``auto`` is asked only where a ``code_exec``
        reward is built (``preflight.resolve_rewards``), so a config without one never probes."""
        from relayrl.rewards.sandbox import MODES

        one_of("reward.sandbox", self.sandbox, MODES)
