"""The reward API: functions with TRL's signature, a registry of built-ins, and loading by name or path.

A reward function is ``fn(prompts: list[str], completions: list[str], **columns) -> list[float]``:
one float per completion; ``columns`` are the dataset's columns, aligned with ``completions``
(``answer=[...]``). Write ``**kwargs`` in your signature so extra columns don't break it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from relayrl.rewards import builtin
from relayrl.rewards.scoring import RewardError, reward_metrics, score_groups

RewardFn = Callable[..., list[float]]

REWARDS: dict[str, RewardFn] = {
    "arith_correct": builtin.arith_correct,
    "answer_format": builtin.answer_format,
    "exact_match": builtin.exact_match,
    "last_number_correct": builtin.last_number_correct,
    "digit_fraction": builtin.digit_fraction,
}
"""Built-in rewards by short name: the names ``load_reward_fn`` accepts besides ``module:function``."""

__all__ = ["REWARDS", "RewardError", "RewardFn", "load_reward_fn", "load_reward_fns", "reward_metrics",
           "score_groups"]


def load_reward_fn(spec: str) -> RewardFn:
    """Resolve a short name from ``REWARDS`` or an import path ``package.module:function``."""
    if spec in REWARDS:
        return REWARDS[spec]
    if spec.count(":") != 1:
        raise ValueError(f"reward {spec!r} is neither a built-in ({', '.join(REWARDS)}) nor an import path; "
                         "write module:function, e.g. my_pkg.rewards:my_reward")
    module_name, attr = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"reward {spec!r}: cannot import module {module_name!r} ({exc}); "
                         "check the module path and that it is importable (on PYTHONPATH)") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(f"reward {spec!r}: module {module_name!r} has no attribute {attr!r}; "
                         "check the function name after the ':'")
    if not callable(fn):
        raise ValueError(f"reward {spec!r} is a {type(fn).__name__}, not a function; "
                         "point it at fn(prompts, completions, **columns) -> list[float]")
    return fn


def load_reward_fns(specs: list[tuple[str, float]]) -> list[tuple[str, RewardFn, float]]:
    """``[(spec, weight)]`` -> ``[(name, fn, weight)]`` for ``score_groups``.

    The name (used in ``traj.rewards`` and metrics as ``reward/<name>``) is the function's name; a
    repeated name gets its position appended (``arith_correct_1``) so no breakdown is overwritten.
    """
    named, seen = [], set()
    for i, (spec, weight) in enumerate(specs):
        fn = load_reward_fn(spec)
        name = spec if spec in REWARDS else spec.split(":")[1]
        name = f"{name}_{i}" if name in seen else name
        seen.add(name)
        named.append((name, fn, float(weight)))
    return named
