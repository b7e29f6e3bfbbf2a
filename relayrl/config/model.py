"""The ``model`` section: which weights, in which dtype, with how much context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from relayrl.config.base import one_of, positive

ModelDtype = Literal["float32", "bfloat16"]
"""Values of ``model.dtype``, a ``str`` field checked against them (``base`` says why)."""


@dataclass
class ModelConfig:
    path: str = "smollm2"
    """A built-in name (``smollm2``, ``tiny-llama``, ``tiny-qwen2``) or a local HF model directory."""
    dtype: str = "float32"
    """Weights and compute dtype for trainer and engine: float32 | bfloat16."""
    max_model_len: int = 512
    """Context length given to vLLM; prompt + max_tokens must fit in it."""

    def __post_init__(self) -> None:
        one_of("model.dtype", self.dtype, ModelDtype)
        positive("model", self, "max_model_len")
