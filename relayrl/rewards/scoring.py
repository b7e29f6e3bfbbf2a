"""Score trajectory groups with weighted reward functions, and summarise the rewards as metrics.

Each function is called **once per batch** over all completions (batched calls let a reward use a
model or a pool), with each group's columns repeated for every completion of that group. The
total is ``traj.reward = sum_i weight_i * r_i``; the unweighted ``r_i`` stay in ``traj.rewards``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from relayrl.types import TrajectoryGroup


class RewardError(RuntimeError):
    """A reward function failed or returned unusable values; one line naming the function and the fix."""


def _flatten(groups: list[TrajectoryGroup]) -> tuple[list[str], list[str], dict[str, list[Any]]]:
    """Prompts, completions and columns as parallel lists with one entry per completion."""
    keys = list(dict.fromkeys(k for g in groups for k in g.columns))
    prompts, completions, columns = [], [], {k: [] for k in keys}
    for g in groups:
        for t in g.trajectories:
            prompts.append(g.prompt)
            completions.append(t.completion_text)
            for k in keys:
                columns[k].append(g.columns.get(k))
    return prompts, completions, columns


def _call(name: str, fn: Callable, prompts: list[str], completions: list[str],
          columns: dict[str, list[Any]]) -> list[float]:
    """Run one reward function and check it gave one finite float per completion."""
    try:
        values = fn(prompts, completions, **columns)
    except Exception as exc:
        raise RewardError(f"reward {name!r} raised {type(exc).__name__}: {exc}; "
                          "fix the function or its columns (it gets prompts, completions, **columns)") from exc
    if not hasattr(values, "__len__"):
        raise RewardError(f"reward {name!r} returned {type(values).__name__}; return a list of floats")
    if len(values) != len(completions):
        raise RewardError(f"reward {name!r} returned {len(values)} values for {len(completions)} completions; "
                          "return one float per completion")
    out = []
    for i, v in enumerate(values):
        try:
            out.append(float(v))
        except (TypeError, ValueError):
            raise RewardError(f"reward {name!r} returned {v!r} at index {i}; return a float for every "
                              "completion (0.0 where it does not apply)") from None
        if not math.isfinite(out[-1]):
            raise RewardError(f"reward {name!r} returned {v} at index {i} for {completions[i][:40]!r}; "
                              "return finite floats")
    return out


def score_groups(groups: list[TrajectoryGroup],
                 fns: list[tuple[str, Callable, float]]) -> list[TrajectoryGroup]:
    """Fill ``traj.rewards[name]`` and ``traj.reward`` for every trajectory (in place); return ``groups``."""
    if not groups:
        return groups
    prompts, completions, columns = _flatten(groups)
    trajectories = [t for g in groups for t in g.trajectories]
    for t in trajectories:
        t.rewards, t.reward = {}, 0.0
    for name, fn, weight in fns:
        for t, value in zip(trajectories, _call(name, fn, prompts, completions, columns)):
            t.rewards[name] = value
            t.reward += weight * value
    return groups


def reward_metrics(groups: list[TrajectoryGroup], primary: str | None = None) -> dict[str, float]:
    """Summaries of a scored batch.

    * ``reward/mean``, ``reward/std``: of the weighted total over all completions (population std).
    * ``reward/<name>``: mean of each function's unweighted value.
    * ``reward/pass_rate``: fraction of completions whose ``primary`` reward (default: the first
      function listed, by convention the task's success check) is >= 1.0, i.e. solved. Read from the
      primary function, not the total, so shaping terms or penalties don't move it.
    * ``reward/zero_std_groups``: fraction of groups whose completions all got the same total; GRPO
      advantages are 0 there, so this is the share of the batch that teaches nothing.
    """
    trajectories = [t for g in groups for t in g.trajectories]
    if not trajectories:
        return {}
    totals = [t.reward for t in trajectories]
    mean = sum(totals) / len(totals)
    metrics = {"reward/mean": mean, "reward/std": math.sqrt(sum((r - mean) ** 2 for r in totals) / len(totals))}
    names = list(trajectories[0].rewards)
    for name in names:
        metrics[f"reward/{name}"] = sum(t.rewards[name] for t in trajectories) / len(trajectories)
    primary = primary or (names[0] if names else None)
    if primary is not None:
        metrics["reward/pass_rate"] = sum(t.rewards[primary] >= 1.0 for t in trajectories) / len(trajectories)
    flat = sum(len({t.reward for t in g.trajectories}) <= 1 for g in groups)
    metrics["reward/zero_std_groups"] = flat / len(groups)
    return metrics
