"""Multi-turn environments: the protocol, tool calls, the built-in calculator, and the registry.

Select one with ``env.name`` in a recipe (``env: {name: calculator, max_turns: 4}``); the rollout actors
then run episodes (``relayrl.rollout.episode``) instead of single completions, and the built-in reward
``env_reward`` reads each episode's reward. Guide: docs/environments.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relayrl.envs.base import Environment
from relayrl.envs.calculator import CalcError, CalculatorEnv, calculate
from relayrl.envs.tools import ToolCall, ToolEnv, ToolError, parse_tool_call

ENVIRONMENTS: dict[str, Callable[..., Environment]] = {
    "calculator": CalculatorEnv,
}
"""Built-in environments by name: the names ``env.name`` accepts besides ``module:Class``."""

__all__ = [
    "ENVIRONMENTS",
    "CalcError",
    "CalculatorEnv",
    "Environment",
    "ToolCall",
    "ToolEnv",
    "ToolError",
    "calculate",
    "env_factory",
    "load_env_class",
    "parse_tool_call",
]


def load_env_class(name: str) -> Callable[..., Environment]:
    """A name from ``ENVIRONMENTS`` or an import path ``package.module:Class`` -> the class (or factory)."""
    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name]
    from relayrl.imports import import_path

    cls = import_path(name, "environment", ENVIRONMENTS, "module:Class, e.g. my_envs:GuessEnv", "class")
    if not callable(cls):
        raise ValueError(f"environment {name!r} names {type(cls).__name__}, not a class; check the name after the ':'")
    return cls


def env_factory(name: str, kwargs: dict[str, Any] | None = None) -> Callable[[], Environment]:
    """A function making one fresh environment per episode: ``load_env_class(name)(**kwargs)``.

    Checks once, here, that the class accepts ``kwargs`` and that an instance has ``reset`` and ``step``.
    """
    cls, kwargs = load_env_class(name), dict(kwargs or {})
    try:
        env = cls(**kwargs)
    except TypeError as exc:
        raise ValueError(
            f"environment {name!r} rejects kwargs={kwargs} ({exc}); set env.kwargs to match its constructor"
        ) from None
    if not isinstance(env, Environment):
        raise ValueError(
            f"environment {name!r} ({type(env).__name__}) lacks reset(sample) or step(action); "
            "implement relayrl.envs.Environment"
        )
    return lambda: cls(**kwargs)
