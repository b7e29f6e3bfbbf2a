"""The ``placement`` config group (``placement=separate|colocated``): where rollout and trainer
run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from relayrl.config.base import one_of

PlacementMode = Literal["separate", "colocated"]
"""``placement.mode`` values, one stored config per value (``root.register_configs``)."""


@dataclass
class PlacementConfig:
    mode: str = "separate"
    """separate: rollout and trainer on disjoint resources; colocated: they share and time-slice."""
    num_cpus: float | None = None
    """CPUs Ray may use on this host (None: all)."""
    offload_trainer: bool = True
    """colocated on GPUs: move the trainer's shards, grads and AdamW state to host memory while the engines
    generate (``trainer/offload.py``); on CPU there is nothing to free and it does nothing."""

    def __post_init__(self) -> None:
        one_of("placement.mode", self.mode, PlacementMode)
