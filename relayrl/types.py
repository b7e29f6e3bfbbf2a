"""Typed records that travel between actors (as Ray object refs), never dicts of tensors.

Shapes are written in comments: ``[T]`` is completion length, ``[B, L]`` batch x padded length.
The rollout's input record, ``Prompt``, lives in ``relayrl.data.sampler`` (torch-free, beside its maker).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the scorer and the rollout actor load this module without torch
    import torch

PolicyVersion = int
"""The trainer step whose weights produced a token. Version 0 is the initial model."""


@dataclass
class VersionSpan:
    """Completion tokens ``[start, end)`` were sampled with weights ``version``."""

    version: PolicyVersion
    start: int
    end: int


@dataclass
class Exclusion:
    """Why a trajectory is left out of training: a reward function could not score it."""

    reward: str  # the reward function's name
    reason: str  # a key of ``relayrl.rewards.scoring.REASONS``: raised | timeout | ...
    detail: str = ""  # one line: the exception, the bad value, the limit that was hit


@dataclass
class Trajectory:
    """One completion of one prompt, as the engine produced it, plus its rewards once scored."""

    prompt_id: int
    sample_idx: int  # index within the group, 0..G-1
    prompt_token_ids: list[int]  # [P]
    completion_token_ids: list[int]  # [T]
    behaviour_logprobs: list[float]  # [T] logprob of each sampled token under the engine's weights
    completion_text: str
    finish_reason: str  # "stop" | "length"
    versions: list[VersionSpan]  # spans covering [0, T)
    rewards: dict[str, float | None] = field(default_factory=dict)  # per function, unweighted; None: n/a or failed
    reward: float = 0.0  # sum of weight * value over the functions that gave a value
    excluded: Exclusion | None = None  # set when a reward failed: the trainer skips this trajectory
    gen_seconds: float = 0.0
    completion_mask: list[int] | None = None
    """[T] 1 where the model sampled the token (trained on), 0 where an environment wrote it (multi-turn
    episodes, ``relayrl.rollout.episode``); None: every token is the model's. Env tokens carry behaviour
    logprob 0.0 (a placeholder: the mask keeps them out of every loss and statistic)."""
    env_reward: float | None = None
    """The episode's reward from its environment (sum of its ``step`` rewards); None without an environment.
    Reward functions read it as the ``env_reward`` column (built-in reward ``env_reward``)."""
    env_metrics: dict[str, float] = field(default_factory=dict)
    """The episode's turns, whether it timed out, and its environment's ``metrics()`` (tool calls and errors
    of a ``ToolEnv``); the step logs their means as ``env/*``. Empty without an environment."""

    @property
    def min_version(self) -> PolicyVersion:
        return min(s.version for s in self.versions) if self.versions else 0


@dataclass
class TrajectoryGroup:
    """The G completions of one prompt: the unit GRPO normalises over and the buffer stores."""

    prompt_id: int
    prompt: str  # the text sent to the engine (after the chat template)
    columns: dict[str, Any]  # dataset columns passed to reward functions (e.g. answer)
    trajectories: list[Trajectory]

    @property
    def min_version(self) -> PolicyVersion:
        return min(t.min_version for t in self.trajectories)


@dataclass
class TrainBatch:
    """A rank's share of a step, padded into tensors the loss consumes."""

    input_ids: torch.Tensor  # [B, L] prompt + completion, right-padded
    attention_mask: torch.Tensor  # [B, L] 1 for real tokens
    loss_mask: torch.Tensor  # [B, L-1] 1 where the *next* token is a completion token
    behaviour_logprobs: torch.Tensor  # [B, L-1] engine logprobs aligned with loss_mask
    advantages: torch.Tensor  # [B] one scalar per sequence (GRPO), or [B, L-1] per token (PPO's GAE)
    prompt_ids: list[int]  # [B]
    target_start: int = 0
    """Column 0 of loss_mask/behaviour_logprobs scores ``input_ids[:, target_start + 1]``. The trainer
    trims prompt-only columns this way and asks the model for logits from there on only."""
    rewards: torch.Tensor | None = None
    """[B] each sequence's total reward (after the trainer's reward shaping): what a critic's returns are
    built from. None in batches that don't carry it."""

    def __len__(self) -> int:
        return self.input_ids.shape[0]
