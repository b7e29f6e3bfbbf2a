"""Score trajectory groups with weighted reward functions; a failing function excludes samples, not the run.

A reward *call* is one function on the completions of ``groups_per_call`` consecutive groups, with each
group's columns repeated for every completion of that group. Per completion and function, the value is

    a float     used:                 rewards[name] = value
    None        "does not apply":     rewards[name] = None; adds nothing to the total (TRL's nan-sum)
    unusable    the completion is excluded from training: traj.excluded = Exclusion(name, reason, detail)

and ``traj.reward = sum_i weight_i * r_i`` over the functions that gave a value, 0.0 when none did
(as TRL, which sums with ``nansum``). Unusable (``REASONS``): the call raised, timed out, its worker
died, or it returned a non-list or a list of the wrong length (every completion of that call is
excluded); or one value was NaN/inf or not a number, or the weighted total overflowed to inf/NaN (that
completion alone is excluded; a total is recorded as reward ``total``). Excluded
completions are never trained on (``algorithms.filtering.trainable_groups``), and ``check_error_rate``
aborts the run, in one line, when too many of a step's completions are excluded.

Running the calls belongs to the caller: ``run_local`` (this process, async functions awaited
concurrently, no timeout) or ``pool.RewardPool`` (Ray worker processes, per-call timeout, killed on hang).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from relayrl.algorithms.filtering import dynamic_sampling_filter, trainable_groups
from relayrl.monitor.schema import REWARD_MEAN, REWARD_PASS_RATE, REWARD_SPREAD_GROUPS, REWARD_STD
from relayrl.types import TrajectoryGroup  # torch-free, as everything the scorer and reward workers import

RewardFns = list[tuple[str, Callable, float]]
"""``[(name, fn, weight)]``: what ``load_reward_fns`` returns and the scorers take."""

REASONS: tuple[str, ...] = (
    "raised",
    "timeout",
    "worker_died",
    "not_a_list",
    "wrong_length",
    "non_finite",
    "not_a_number",
)
"""Why a completion could not be scored; each is counted as ``reward/errors/<reason>``."""


class RewardError(RuntimeError):
    """Scoring cannot go on (too many completions failed, or none is left to train on); one line."""


@dataclass
class Scored:
    """One scoring call's result as control reads it: decisions use the typed fields, ``metrics`` is
    only logged (the scheduler never reads a metric key to decide)."""

    useful: int  # trainable groups whose rewards vary: what dynamic sampling counts
    min_version: int  # oldest policy version among the groups' tokens
    max_version: int  # newest one (min_version when no completion has a token)
    metrics: dict[str, Any]  # reward metrics and the caller's summary, combined per step for logs

    @classmethod
    def of(cls, groups: list[TrajectoryGroup], metrics: dict[str, Any]) -> Scored:
        """The fields read off the scored ``groups`` themselves (not off ``metrics``)."""
        low, high = version_span(groups)
        return cls(spread_groups(groups), low, high, metrics)


def version_span(groups: list[TrajectoryGroup]) -> tuple[int, int]:
    """(oldest, newest) policy version among the groups' tokens; (0, 0) for no groups. A completion
    without tokens has no span and adds nothing to the newest."""
    if not groups:
        return 0, 0
    low = min(g.min_version for g in groups)
    spans = [t.versions[-1].version for g in groups for t in g.trajectories if t.versions]
    return int(low), int(max(spans, default=low))


def spread_groups(groups: list[TrajectoryGroup]) -> int:
    """Trainable groups (2+ scored completions) whose rewards vary: what DAPO's dynamic sampling keeps."""
    return len(dynamic_sampling_filter(trainable_groups(groups))[0])


@dataclass
class Batch:
    """A step's completions as parallel lists, one entry per completion (group columns repeated)."""

    prompts: list[str]
    completions: list[str]
    columns: dict[str, list[Any]]

    def slice(self, start: int, stop: int) -> tuple[list[str], list[str], dict[str, list[Any]]]:
        return (
            self.prompts[start:stop],
            self.completions[start:stop],
            {k: v[start:stop] for k, v in self.columns.items()},
        )


@dataclass(frozen=True)
class Call:
    """Reward function ``fn`` (an index into the fns) on completions ``[start, stop)`` of the ``Batch``."""

    fn: int
    start: int
    stop: int


@dataclass
class CallResult:
    """One call's outcome: ``values[j]`` is usable iff ``reasons[j] is None`` (None value = not applicable)."""

    values: list[float | None]
    reasons: list[str | None]
    detail: str = ""  # the call's first problem, one line

    @classmethod
    def failed(cls, n: int, reason: str, detail: str) -> CallResult:
        return cls([None] * n, [reason] * n, _one_line(detail))


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def flatten(groups: list[TrajectoryGroup]) -> Batch:
    """Prompts, completions and columns with one entry per completion, groups in order.

    Episodes from an environment add the per-completion column ``env_reward`` (``Trajectory.env_reward``),
    only then, so reward functions of single-turn runs see the dataset's columns alone.
    """
    keys = list(dict.fromkeys(k for g in groups for k in g.columns))
    batch = Batch([], [], {k: [] for k in keys})
    for g in groups:
        for t in g.trajectories:
            batch.prompts.append(g.prompt)
            batch.completions.append(t.completion_text)
            for k in keys:
                batch.columns[k].append(g.columns.get(k))
    env_rewards = [t.env_reward for g in groups for t in g.trajectories]
    if any(r is not None for r in env_rewards):
        batch.columns["env_reward"] = env_rewards
    return batch


def plan_calls(groups: list[TrajectoryGroup], num_fns: int, groups_per_call: int) -> list[Call]:
    """Every function on every chunk of ``groups_per_call`` consecutive groups (function-major order)."""
    bounds, start = [], 0
    for i in range(0, len(groups), groups_per_call):
        stop = start + sum(len(g.trajectories) for g in groups[i : i + groups_per_call])
        bounds.append((start, stop))
        start = stop
    return [Call(k, a, b) for k in range(num_fns) for a, b in bounds if b > a]


def check_values(raw: Any, n: int) -> CallResult:
    """Validate a reward function's return value for ``n`` completions (see the module docstring)."""
    if isinstance(raw, (str, bytes, dict)) or not hasattr(raw, "__len__"):
        return CallResult.failed(n, "not_a_list", f"returned {type(raw).__name__}, not a list of floats")
    if len(raw) != n:
        return CallResult.failed(n, "wrong_length", f"returned {len(raw)} values for {n} completions")
    result = CallResult([], [])
    for i, v in enumerate(raw):
        value, reason = _check_value(v)
        result.values.append(value)
        result.reasons.append(reason)
        if reason and not result.detail:
            result.detail = _one_line(f"returned {v!r} at index {i}")
    return result


def _check_value(v: Any) -> tuple[float | None, str | None]:
    if v is None:
        return None, None
    if isinstance(v, (str, bytes)):
        return None, "not_a_number"
    try:
        value = float(v)
    except (TypeError, ValueError):
        return None, "not_a_number"
    return (value, None) if math.isfinite(value) else (None, "non_finite")


def is_async(fn: Callable) -> bool:
    """``async def`` functions, partials of them and objects with an ``async def __call__``."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004 - the method itself


async def invoke(
    fn: Callable,
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list[Any]],
    executor: Executor | None = None,
) -> CallResult:
    """Call ``fn`` once and check its values. Async functions are awaited on the running loop; sync ones
    run on ``executor`` (so the loop stays free for concurrent async calls) or inline when it is None."""
    try:
        if is_async(fn) or executor is None:
            raw = fn(prompts, completions, **columns)
        else:
            loop = asyncio.get_running_loop()
            raw = await loop.run_in_executor(executor, functools.partial(fn, prompts, completions, **columns))
        if inspect.isawaitable(raw):
            raw = await raw
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure of user code is recorded, not raised
        return CallResult.failed(len(completions), "raised", f"raised {type(exc).__name__}: {exc}")
    return check_values(raw, len(completions))


def run_local(fns: RewardFns, batch: Batch, calls: list[Call]) -> list[CallResult]:
    """Run ``calls`` in this process: sync functions one after another, async ones concurrently (no timeout)."""

    async def run_all() -> list[CallResult]:
        return list(await asyncio.gather(*(invoke(fns[c.fn][1], *batch.slice(c.start, c.stop)) for c in calls)))

    return asyncio.run(run_all())


def unique_names(fns: RewardFns) -> RewardFns:
    """Append the position to a repeated name (``f``, ``f_1``) so no breakdown overwrites another."""
    seen, out = set(), []
    for i, (name, fn, weight) in enumerate(fns):
        name = f"{name}_{i}" if name in seen else name
        seen.add(name)
        out.append((name, fn, float(weight)))
    return out


def fill_rewards(groups: list[TrajectoryGroup], fns: RewardFns, calls: list[Call], results: list[CallResult]) -> None:
    """Write ``rewards``, ``reward`` and ``excluded`` of every trajectory from the calls' results (in place).

    A trajectory failed by several functions records the first (in ``fns`` order).
    """
    from relayrl.types import Exclusion

    trajs = [t for g in groups for t in g.trajectories]
    for t in trajs:
        t.rewards, t.reward, t.excluded = {name: None for name, _, _ in fns}, 0.0, None
    for call, result in sorted(zip(calls, results), key=lambda cr: cr[0].fn):
        name = fns[call.fn][0]
        for t, value, reason in zip(trajs[call.start : call.stop], result.values, result.reasons, strict=True):
            t.rewards[name] = value
            if reason and t.excluded is None:
                t.excluded = Exclusion(name, reason, result.detail)
    for t in trajs:
        if t.excluded is None:
            _total(t, fns, Exclusion)


def _total(t: Any, fns: RewardFns, exclusion: type) -> None:
    """``t.reward = sum_i w_i * r_i``; a total that is not finite (finite values times large weights can
    overflow to inf, and inf - inf is NaN) excludes ``t`` as ``non_finite``, exactly as a NaN value does:
    one inf in a group would make its mean and std inf and every advantage of the group NaN."""
    total = sum(w * t.rewards[name] for name, _, w in fns if t.rewards[name] is not None)
    if math.isfinite(total):
        t.reward = total
    else:
        t.excluded = exclusion("total", "non_finite", f"weighted total {total!r} is not finite")


def score_groups(
    groups: list[TrajectoryGroup], fns: RewardFns, groups_per_call: int = 1, max_error_rate: float = 1.0
) -> list[TrajectoryGroup]:
    """Score ``groups`` in this process (``run_local``); fill each trajectory in place and return ``groups``.

    No isolation: a hanging function hangs the caller. Training runs use ``pool.RewardPool``.
    """
    if not groups:
        return groups
    fns = unique_names(fns)
    calls = plan_calls(groups, len(fns), groups_per_call)
    fill_rewards(groups, fns, calls, run_local(fns, flatten(groups), calls))
    check_error_rate(groups, max_error_rate)
    return groups


def check_error_rate(groups: list[TrajectoryGroup], max_error_rate: float) -> None:
    """Raise ``RewardError`` when more than ``max_error_rate`` of the completions are excluded, or when no
    group has anything left to train on; the message names the first failure and the fix."""
    trajs = [t for g in groups for t in g.trajectories]
    failed = [t.excluded for t in trajs if t.excluded is not None]
    if not failed:
        return
    first = f"first: reward {failed[0].reward!r} {failed[0].reason}: {failed[0].detail}"
    if len(failed) / len(trajs) > max_error_rate:
        raise RewardError(
            f"rewards failed on {len(failed)} of {len(trajs)} completions ({len(failed) / len(trajs):.0%}"
            f" > reward.max_error_rate={max_error_rate:g}); {first}; fix the reward function "
            "or raise reward.max_error_rate"
        )
    if not trainable_groups(groups):
        raise RewardError(
            f"no prompt group has 2 scored completions left to train on ({len(failed)} of "
            f"{len(trajs)} failed); {first}; fix the reward function or raise algorithm.group_size"
        )


def fn_metrics(fns: RewardFns) -> dict[str, float]:
    """What reward objects report about themselves (a ``metrics()`` method, e.g. ``code_exec``'s sandbox
    isolation level), merged in ``fns`` order; the scorer adds it to every step's metrics."""
    out: dict[str, float] = {}
    for _, fn, _ in fns:
        metrics = getattr(fn, "metrics", None)
        if callable(metrics):
            out.update(metrics())
    return out


def reward_metrics(groups: list[TrajectoryGroup], primary: str | None = None) -> dict[str, float]:
    """Summaries of a scored batch; reward statistics cover the completions that were not excluded.

    * ``reward/mean``, ``reward/std``: of the weighted total (population std).
    * ``reward/<name>``: mean of each function's unweighted value where it applied (None skipped, as
      TRL's nanmean); absent when it applied nowhere.
    * ``reward/pass_rate``: fraction whose ``primary`` reward (default: the first function, by
      convention the task's success check) is >= 1.0; read from it, not the total, so shaping terms
      don't move it.
    * ``reward/zero_std_groups``: fraction of groups whose scored completions all got the same total;
      GRPO advantages are 0 there, so this is the share of the batch that teaches nothing.
    * ``reward/errors``, ``reward/error_rate``, ``reward/errors/<reason>``: excluded completions, their
      fraction, and their count per reason (``REASONS``; the first failing function's reason).
    * ``reward/dropped_groups``: groups not trained on because exclusion left them fewer than 2 samples.
    * ``reward/spread_groups``: trainable groups whose rewards vary: what DAPO's dynamic sampling keeps,
      and what the buffer counts towards a step when it refills.
    """
    trajs = [t for g in groups for t in g.trajectories]
    if not trajs:
        return {}
    valid = [t for t in trajs if t.excluded is None]
    reasons = Counter(t.excluded.reason for t in trajs if t.excluded is not None)
    metrics = {
        "reward/errors": float(len(trajs) - len(valid)),
        "reward/error_rate": 1 - len(valid) / len(trajs),
        **{f"reward/errors/{r}": float(reasons[r]) for r in REASONS},
        "reward/dropped_groups": float(len(groups) - len(trainable_groups(groups))),
        REWARD_SPREAD_GROUPS: float(spread_groups(groups)),
    }
    if valid:
        metrics.update(_value_metrics(groups, valid, primary))
    return metrics


def _value_metrics(groups: list[TrajectoryGroup], valid: list, primary: str | None) -> dict[str, float]:
    totals = [t.reward for t in valid]
    mean = sum(totals) / len(totals)
    metrics = {REWARD_MEAN: mean, REWARD_STD: math.sqrt(sum((r - mean) ** 2 for r in totals) / len(totals))}
    names = list(valid[0].rewards)
    for name in names:
        applied = [t.rewards[name] for t in valid if t.rewards[name] is not None]
        if applied:
            metrics[f"reward/{name}"] = sum(applied) / len(applied)
    primary = primary or (names[0] if names else None)
    if primary is not None:
        metrics[REWARD_PASS_RATE] = sum((t.rewards.get(primary) or 0.0) >= 1.0 for t in valid) / len(valid)
    scored = [{t.reward for t in g.trajectories if t.excluded is None} for g in groups]
    scored = [s for s in scored if s]
    metrics["reward/zero_std_groups"] = sum(len(s) == 1 for s in scored) / max(len(scored), 1)
    return metrics
