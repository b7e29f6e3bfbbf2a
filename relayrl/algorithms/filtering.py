"""Which prompt groups a step can learn from, decided on the groups alone (rewards and exclusions, no tensors).

The trainer applies these before it builds a batch (``trainer.batch.build_train_batch``, DAPO's dynamic sampling in
``objective``); the reward scorer counts them for its metrics and error check (``rewards.scoring``), in a
process that never imports torch (importing it would cost that Ray worker seconds of CPU at start-up, beside
the engines and trainer ranks that need the cores then)."""

from __future__ import annotations

from relayrl.types import TrajectoryGroup


def trainable_groups(groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """``groups`` without excluded trajectories; a group that exclusion leaves with fewer than 2 is dropped.

    Why drop it: a lone sample has no group baseline (grouped estimators give it advantage 0) and it
    would still count in token-mean denominators. A group that had one sample to begin with (G=1,
    e.g. REINFORCE++) and lost none is kept. Groups without exclusions are returned as they are.
    """
    out = []
    for g in groups:
        kept = [t for t in g.trajectories if t.excluded is None]
        if len(kept) == len(g.trajectories):
            out.append(g)
        elif len(kept) >= 2:
            out.append(TrajectoryGroup(g.prompt_id, g.prompt, g.columns, kept))
    return out


def has_reward_spread(group: TrajectoryGroup) -> bool:
    """True when the group's scored completions did not all get the same total reward.

    Exact equality, as ``reward/zero_std_groups`` counts, so ``dapo/dropped_groups`` / groups equals that
    metric; excluded trajectories (a failed reward) don't count.
    """
    return len({t.reward for t in group.trajectories if t.excluded is None}) > 1


def dynamic_sampling_filter(groups: list[TrajectoryGroup]) -> tuple[list[TrajectoryGroup], int]:
    """(groups whose rewards vary, number of groups dropped): DAPO's filter ``0 < |correct| < G`` (Yu et al.
    2025, sec. 3.2), for any reward (not only 0/1). Order is kept; the caller decides what to do with an empty
    result."""
    kept = [g for g in groups if has_reward_spread(g)]
    return kept, len(groups) - len(kept)
