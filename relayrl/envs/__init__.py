"""Multi-turn environments: the protocol, typed tools in the model's chat format, built-in environments,
and the registry.

Select one with ``env.name`` in a recipe (``env: {name: calculator, max_turns: 3}``); the rollout actors
then run episodes (``relayrl.rollout.episode``) instead of single completions, and the built-in reward
``env_reward`` reads each episode's reward. Guide: docs/environments.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relayrl.envs.base import Environment
from relayrl.envs.calculator import CalcError, CalculatorEnv, calculate
from relayrl.envs.chat import ChatTools, Parsed, chat_tools
from relayrl.envs.python import PythonEnv
from relayrl.envs.retrieval import RetrievalEnv
from relayrl.envs.toolenv import ToolEnv
from relayrl.envs.tools import Tool, ToolCall, ToolError, as_tool, call_tool

ENVIRONMENTS: dict[str, Callable[..., Environment]] = {
    "calculator": CalculatorEnv,
    "python": PythonEnv,
    "retrieval": RetrievalEnv,
}
"""Built-in environments by name: the names ``env.name`` accepts besides ``module:Class``."""

__all__ = [
    "ENVIRONMENTS",
    "CalcError",
    "CalculatorEnv",
    "ChatTools",
    "Environment",
    "Parsed",
    "PythonEnv",
    "RetrievalEnv",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "ToolError",
    "as_tool",
    "calculate",
    "call_tool",
    "chat_tools",
    "env_factory",
    "load_env_class",
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

    Checks once, here, that the class accepts ``kwargs``, that an instance has ``reset`` and ``step``, and
    that a tool environment's tools have schemas (type hints and docstrings).
    """
    cls, kwargs = load_env_class(name), dict(kwargs or {})
    try:
        env = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"environment {name!r} rejects kwargs={kwargs} ({exc}); set env.kwargs to match") from None
    if not isinstance(env, Environment):
        raise ValueError(
            f"environment {name!r} ({type(env).__name__}) lacks reset(sample) or step(action); "
            "implement relayrl.envs.Environment"
        )
    if isinstance(env, ToolEnv):
        env.toolset  # noqa: B018 - derives the schemas now: a tool without type hints fails here, not mid-run
    return lambda: cls(**kwargs)
