"""relayrl: RL post-training for LLMs (Ray controller, vLLM rollouts, FSDP2 trainers).

Python API::

    import relayrl
    cfg = relayrl.load_config("grpo_arith", ["run.steps=10"])
    relayrl.train(cfg, rewards=[my_reward_fn])
    relayrl.scale("runs/<id>", replicas=2)  # from another process, while it runs
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from relayrl.config import Config, ConfigError, load_config

if TYPE_CHECKING:  # the controller (Ray, torch) is imported only when train runs
    from relayrl.controller.driver import RunResult


def train(cfg: Config, rewards: list[Callable] | None = None) -> RunResult:
    """Run ``cfg`` end to end; ``rewards`` is an optional list of reward callables (TRL signature)."""
    from relayrl.controller import train as _train

    return _train(cfg, rewards)


def scale(run_dir: str, replicas: int) -> str:
    """Ask the running run in ``run_dir`` for ``replicas`` rollout replicas (``relayrl scale``); returns the
    console line, or raises ``ScaleError`` (one line, nothing changed) for a run that is not running."""
    from relayrl.controller.membership import request_scale

    return request_scale(run_dir, replicas)


__all__ = ["Config", "ConfigError", "load_config", "scale", "train"]
