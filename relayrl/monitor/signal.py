"""Is the run learning anything? A GRPO-family update learns only from groups whose rewards vary; a run where
nearly every group scores the same on every completion (all 0: the task is out of reach; all 1: it is
solved) spends its steps for no gradient. ``NoSignal`` watches each logged step and, after
``logging.no_signal_steps`` such steps in a row, returns one line naming the cause and what to try, once.
"""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.monitor.schema import REWARD_MEAN, REWARD_ZERO_STD_GROUPS

FLAT_FRACTION = 0.9
"""A step has no signal when at least this fraction of its groups had zero reward spread."""


@dataclass
class NoSignal:
    """Counts the steps in a row without signal; ``observe`` returns the warning the step it reaches
    ``steps`` (0: never), and only the first time in a run."""

    steps: int
    streak: int = 0
    warned: bool = False

    def observe(self, metrics: dict[str, float]) -> str | None:
        flat = metrics.get(REWARD_ZERO_STD_GROUPS)
        if flat is None:  # the step scored nothing (e.g. every completion excluded): neither kind
            return None
        self.streak = self.streak + 1 if flat >= FLAT_FRACTION else 0
        if self.warned or self.steps <= 0 or self.streak < self.steps:
            return None
        self.warned = True
        return no_signal_line(self.streak, flat, metrics.get(REWARD_MEAN, float("nan")))


def no_signal_line(streak: int, flat: float, reward_mean: float) -> str:
    """The warning: how long and how flat, the likely cause, what to try."""
    return (
        f"relayrl: no learning signal: for {streak} steps in a row at least {FLAT_FRACTION:.0%} of prompt groups "
        f"gave every completion the same reward (last step {flat:.0%}, reward mean {reward_mean:.3f}), so their "
        "advantages are 0 and the updates learn nothing; the task is too hard (or already solved) for this "
        "model: try a supervised warm start (sft.steps=10), easier problems (data.ops, data.max_operand), a "
        "reward with partial credit or a larger algorithm.group_size; see docs/learning.md"
    )
