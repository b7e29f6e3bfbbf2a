"""The environment protocol: what a multi-turn episode runner needs from an environment.

An episode alternates model turns and environment turns (``relayrl.rollout.episode``)::

    obs_0 = env.reset(sample)                   # the first model input (text)
    for turn in 1..max_turns:
        action = <model samples until EOS, max_tokens or one of env.stop>
        obs, reward, done = env.step(action)    # episode reward = sum of the step rewards
        if done: break
        <obs is tokenized and appended; its tokens are masked out of the loss>

Environments are plain classes: one instance per episode, so they may keep per-episode state on
``self``. ``reset``/``step`` may be ``async def`` (awaited on the rollout actor's event loop: never block
in them) or plain (run in a worker thread, so a blocking plain ``step`` - a subprocess, an HTTP call -
does not stall the engine's other episodes). An exception in either ends the generate call with the
environment's message; the rollout actor stays up and is not restarted (the error would repeat).

Two optional methods: ``setup(tokenizer)``, called before ``reset`` with the engine's tokenizer (tool
environments render their tools and results through its chat template, ``relayrl.envs.chat``), and
``metrics() -> dict[str, float]``, read when the episode ends (``tool_calls``, ``tool_errors``: the run's
``env/*`` metrics).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


@runtime_checkable
class Environment(Protocol):
    """A multi-turn environment.

    Optional attribute ``stop: list[str]``: strings that end a model turn besides EOS (e.g. a tool
    call's closing tag ``</calc>``), so the environment can answer the call before the model goes on.
    The stop string stays in the action and in the trajectory's tokens.
    """

    def reset(self, sample: dict[str, Any]) -> str:
        """Start an episode for ``sample`` (the dataset row's columns plus ``prompt``: the text the data
        pipeline built, chat template applied) and return the first model input, usually ``sample["prompt"]``."""
        ...

    def step(self, action: str) -> tuple[str, float, bool] | Awaitable[tuple[str, float, bool]]:
        """React to the model's turn ``action`` (its text): ``(observation, reward, done)``.

        ``observation`` is appended verbatim after the action when ``done`` is False (it is ignored when
        the episode ends), so include any separators or chat-template markers it needs.
        """
        ...


ENV_THREADS = 64
"""Worker threads for environment work (plain ``reset``/``step``, tool calls). asyncio's default pool has
``cpu_count + 4`` (6 on a 2-core box): six hanging tools would stall every other episode's calls."""


@functools.cache
def _executor() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(ENV_THREADS, thread_name_prefix="relayrl-env")


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the environment thread pool, awaited without blocking the event loop."""
    return await asyncio.get_running_loop().run_in_executor(_executor(), functools.partial(fn, *args))
