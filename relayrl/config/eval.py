"""The ``eval`` section: ``relayrl eval`` and evaluation during training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from relayrl.config.base import ConfigError, choices_of

EvalSplit = Literal["heldout", "data"]
"""Values of ``eval.split``, a ``str`` field checked against them (``base`` says why)."""


@dataclass
class EvalConfig:
    """What ``relayrl eval`` scores (``monitor/evaluate.py``), and evaluation during training
    (``controller/training_eval.py``: ``every``, ``before_first_step``, ``samples``, ``train_prompts``)."""

    num_prompts: int = 64
    """Prompts scored (x ``-n`` samples each); 0: every prompt of the split. Bounds an eval's time."""
    split: str = "heldout"
    """heldout: prompts training never draws (arith: operand pairs absent from the training rows; see
    ``data.eval_split.heldout_arith_rows``); data: the first num_prompts rows of ``data`` as training
    loads them (point data.path at a test file to score it)."""
    seed: int = 1
    """Seed of the held-out draw (its own stream; training's data.seed picks what is excluded) and of the
    sampled completions of evaluation during training."""
    every: int = 0
    """Evaluate during training after every N-th step, on the weights that step synced to the engines
    (logged with that step); 0: off."""
    before_first_step: bool = True
    """With ``every`` > 0: also evaluate the initial weights (version 0) before step 1, logged as step 0."""
    samples: int = 4
    """Evaluation during training: sampled completions per prompt (at ``rollout.temperature``) behind
    ``eval/sampled_accuracy`` and ``eval/pass@<samples>``; one greedy completion per prompt is scored too."""
    train_prompts: int = 16
    """Evaluation during training: held-out prompts, drawn once (the first of ``split``, as ``relayrl eval
    --limit`` draws them) and the same at every evaluation. Each costs 1 + ``samples`` completions."""

    def __post_init__(self) -> None:
        if self.num_prompts < 0:
            raise ConfigError(f"eval.num_prompts={self.num_prompts} must be >= 0 (0: all); set eval.num_prompts=64")
        if self.split not in choices_of(EvalSplit):
            raise ConfigError(f"eval.split={self.split!r} is not supported; use heldout or data")
        if self.every < 0:
            raise ConfigError(
                f"eval.every={self.every} must be >= 0 (0: no evaluation during training); set eval.every=10"
            )
        if self.samples < 1:
            raise ConfigError(
                f"eval.samples={self.samples} must be >= 1 (sampled completions per prompt); set eval.samples=4"
            )
        if self.train_prompts < 1:
            raise ConfigError(
                f"eval.train_prompts={self.train_prompts} must be >= 1 (held-out prompts scored "
                "during training); set eval.train_prompts=16"
            )
