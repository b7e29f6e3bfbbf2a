"""The ``logging`` section: wandb, the console line, samples (``monitor/metrics.py`` reads it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from relayrl.config.base import ConfigError, one_of

WandbMode = Literal["offline", "online", "disabled"]
"""Values of ``logging.wandb``, a ``str`` field checked against them (``base`` says why)."""


@dataclass
class LoggingConfig:
    wandb: str = "offline"
    """wandb mode: offline (default; files under the run dir) | online | disabled."""
    project: str = "relayrl"
    """wandb project."""
    console: bool = True
    """Print a progress line per step."""
    verbose: bool = False
    """Also show every actor's and engine's output (vLLM, Ray, transformers) on the console, as Ray
    prints it; off: it goes only to ``<run dir>/logs/`` and the console keeps relayrl's lines, errors and
    Ray's resource messages (``relayrl/logs.py``). ``relayrl train --verbose`` sets it."""
    samples_per_step: int = 2
    """Completions written to samples.jsonl per step."""
    no_signal_steps: int = 5
    """Warn once, on the console, after this many steps in a row where at least 90 % of prompt groups gave all
    their completions the same reward (nothing for a group-relative update to learn); 0: never."""

    def __post_init__(self) -> None:
        one_of("logging.wandb", self.wandb, WandbMode)
        if self.no_signal_steps < 0:
            raise ConfigError(
                f"logging.no_signal_steps={self.no_signal_steps} must be >= 0 (0: never warn); "
                "set logging.no_signal_steps=5"
            )
