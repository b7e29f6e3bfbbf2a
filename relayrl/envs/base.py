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
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


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

    def step(self, action: str) -> tuple[str, float, bool]:
        """React to the model's turn ``action`` (its text): ``(observation, reward, done)``.

        ``observation`` is appended verbatim after the action when ``done`` is False (it is ignored when
        the episode ends), so include any separators or chat-template markers it needs.
        """
        ...
