"""The weight-sync interface: the trainer sends a state dict, engines load it from a small handle.

A backend is one class with one trainer-side method, ``send``, plus the engine-side reader
``open_weights`` for the format that ``send`` writes, so the wire format lives in one place.
The ``WeightHandle`` that ``send`` returns is what travels through Ray and vLLM's
``collective_rpc``: a few fields naming where the weights are, never the tensors themselves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch


@dataclass(frozen=True)
class WeightHandle:
    """Where version ``version`` of the weights can be read, and how much there is."""

    backend: str          # key in ``relayrl.weightsync.BACKENDS``
    location: str         # backend-specific address (shm: a file path)
    version: int          # policy version these weights are (trainer step)
    nbytes: int           # payload size, for throughput stats
    num_tensors: int      # tensors in the payload; the reader checks it

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for vLLM's ``collective_rpc`` (its msgpack path carries builtins, not dataclasses)."""
        return asdict(self)


class WeightSender(ABC):
    """Trainer side of a backend: publish one version of the weights, return its handle."""

    name: ClassVar[str]

    @abstractmethod
    def send(self, state_dict: dict[str, torch.Tensor], version: int) -> WeightHandle:
        """Make ``state_dict`` (HF parameter names -> full tensors) readable by engines as ``version``."""

    @staticmethod
    @abstractmethod
    def open_weights(handle: WeightHandle) -> Iterator[tuple[str, torch.Tensor]]:
        """Engine side: yield ``(name, tensor)`` pairs of the weights ``handle`` points at."""

    def close(self) -> None:
        """Release what the sender still holds (files, buffers). Default: nothing."""
