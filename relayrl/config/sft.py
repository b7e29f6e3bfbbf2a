"""The ``sft`` section: an optional supervised warm start on worked solutions before RL (``trainer/sft.py``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from relayrl.config.base import ConfigError, positive


@dataclass
class SftConfig:
    steps: int = 0
    """Optimizer steps of supervised fine-tuning before RL starts; 0: none. The RL run then starts from (and its
    KL reference is) the fine-tuned model, written to ``<run dir>/sft`` and reused on resume."""
    examples: int = 256
    """Generated tasks with worked solutions (wordproblem, countdown): how many examples to draw. They are
    drawn with their own seed, apart from the RL prompts."""
    path: str | None = None
    """Or a local jsonl in TRL's prompt-completion format: ``{"prompt": str | messages, "completion": str}``
    per line; the prompt goes through the chat template as the RL prompts do."""
    batch_size: int = 8
    """Examples per optimizer step."""
    lr: float = 1e-4
    """AdamW learning rate (constant; no weight decay)."""

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ConfigError(f"sft.steps={self.steps} must be >= 0 (0: no warm start); set sft.steps=30")
        positive("sft", self, "examples", "batch_size", "lr")
        if self.path and not os.path.isfile(self.path):
            raise ConfigError(
                f"sft.path={self.path} is not a file; point it at a jsonl of prompt/completion rows or unset it"
            )
