"""Reward functions that misbehave on purpose, chosen by the prompt text (importable by Ray workers).

Prompts: ``raise`` raises, ``hang`` writes its pid to the ``pidfile`` column then spins forever, ``nan``
returns NaN for the first completion, ``short`` returns one value too few, ``text`` returns a string,
``none`` returns None for every completion; anything else gets ``len(completion)``.
"""

from __future__ import annotations

import asyncio
import math
import os
from pathlib import Path


def flaky(prompts, completions, pidfile=None, **_):
    kind = prompts[0]
    if kind == "raise":
        raise KeyError("answer")
    if kind == "hang":
        Path(pidfile[0]).write_text(str(os.getpid()))
        while True:          # a busy loop: only killing the process stops it
            pass
    if kind == "nan":
        return [math.nan] + [1.0] * (len(completions) - 1)
    if kind == "short":
        return [1.0] * (len(completions) - 1)
    if kind == "text":
        return "1.0"
    if kind == "none":
        return [None] * len(completions)
    return [float(len(c)) for c in completions]


async def sleepy(prompts, completions, **_):
    """Takes 0.5 s of waiting (not CPU) per call, then pays 1.0."""
    await asyncio.sleep(0.5)
    return [1.0] * len(completions)
