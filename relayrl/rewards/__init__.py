"""The reward API: functions with TRL's signature, a registry of built-ins, and loading by name or path.

A reward function is ``fn(prompts: list[str], completions: list[str], **columns) -> list[float | None]``,
plain or ``async def``: one value per completion, None where it does not apply; ``columns`` are the
dataset's columns, aligned with ``completions`` (``answer=[...]``). Write ``**kwargs`` in your signature
so extra columns don't break it. How values combine and what happens when a function fails:
``scoring``; where functions run (Ray worker processes, timeouts): ``pool``. Guide: docs/rewards.md.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from relayrl.rewards import builtin, tasks
from relayrl.rewards.reward_model import RewardModel
from relayrl.rewards.scoring import REASONS, RewardError, RewardFns, reward_metrics, score_groups

RewardFn = Callable[..., list[float | None]]

REWARDS: dict[str, Callable] = {
    "arith_correct": builtin.arith_correct,
    "answer_format": builtin.answer_format,
    "exact_match": builtin.exact_match,
    "last_number_correct": builtin.last_number_correct,
    "digit_fraction": builtin.digit_fraction,
    "env_reward": builtin.env_reward,
    "math_verify": builtin.math_verify,
    "think_format": builtin.think_format,
    "regex_match": builtin.regex_match,
    "length_penalty": builtin.length_penalty,
    "code_exec": builtin.CodeExec,
    "think_answer_format": tasks.think_answer_format,
    "answer_tag_correct": tasks.answer_tag_correct,
    "countdown_correct": tasks.countdown_correct,
    "count_correct": tasks.count_correct,
    "reward_model": RewardModel,
}
"""Built-in rewards by short name: the names ``load_reward_fn`` accepts besides ``module:function``.
A class here (``reward_model``, ``code_exec``) is constructed with the spec's ``kwargs``; a function gets
them bound. A reward object with a ``metrics() -> dict`` method adds those to every step's metrics."""

__all__ = [
    "REASONS",
    "REWARDS",
    "RewardError",
    "RewardFn",
    "RewardFns",
    "RewardModel",
    "load_reward_fn",
    "load_reward_fns",
    "reward_metrics",
    "score_groups",
]


def load_reward_fn(spec: str, kwargs: dict[str, Any] | None = None) -> RewardFn:
    """Resolve a short name from ``REWARDS`` or an import path ``package.module:function``, then apply
    ``kwargs``: a class is constructed with them (the instance is the reward), a function gets them bound."""
    obj = REWARDS[spec] if spec in REWARDS else _import(spec)
    if not callable(obj):
        raise ValueError(
            f"reward {spec!r} is a {type(obj).__name__}, not a function; "
            "point it at fn(prompts, completions, **columns) -> list[float]"
        )
    kwargs = dict(kwargs or {})
    try:
        if isinstance(obj, type):
            return obj(**kwargs)
        if kwargs:
            inspect.signature(obj).bind_partial(None, None, **kwargs)
            return functools.update_wrapper(functools.partial(obj, **kwargs), obj)
    except TypeError as exc:
        raise ValueError(
            f"reward {spec!r} rejects kwargs={kwargs} ({exc}); set rewards[].kwargs to match its parameters"
        ) from None
    return obj


def _import(spec: str) -> Any:
    from relayrl.imports import import_path

    return import_path(spec, "reward", REWARDS, "module:function, e.g. my_pkg.rewards:my_reward")


def load_reward_fns(specs: list[tuple], sandbox: str | None = None) -> RewardFns:
    """``[(spec, weight)]`` or ``[(spec, weight, kwargs)]`` -> ``[(name, fn, weight)]`` for the scorers.

    ``sandbox`` (``reward.sandbox``) is given to the rewards that run programs (``code_exec``) unless the
    spec's kwargs set it, so ``auto`` on a host without full isolation fails here, before any worker starts.

    The name (used in ``traj.rewards`` and metrics as ``reward/<name>``) is the built-in name or the part
    after ``:``; a repeated name gets its position appended (``arith_correct_2``) so no breakdown is
    overwritten.
    """
    named, seen = [], set()
    for i, (spec, weight, *rest) in enumerate(specs):
        kwargs = dict(rest[0] or {}) if rest else {}
        if sandbox is not None and REWARDS.get(spec) is builtin.CodeExec:
            kwargs.setdefault("sandbox", sandbox)
        fn = load_reward_fn(spec, kwargs)
        name = spec if spec in REWARDS else spec.split(":")[1]
        name = f"{name}_{i}" if name in seen else name
        seen.add(name)
        named.append((name, fn, float(weight)))
    return named
