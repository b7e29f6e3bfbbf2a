"""Reward functions that misbehave on purpose, chosen by the prompt text (importable by Ray workers).

Prompts: ``raise`` raises, ``hang`` writes its pid to the ``pidfile`` column then spins forever, ``nan``
returns NaN for the first completion, ``short`` returns one value too few, ``text`` returns a string,
``none`` returns None for every completion; anything else gets ``len(completion)``.

``sleepy`` appends ``pid start end`` (``time.monotonic``, one clock for all processes of the host) to the
file named by its ``spans`` column, so a test can prove calls overlapped without timing thresholds.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from pathlib import Path


def flaky(prompts, completions, pidfile=None, **_):
    kind = prompts[0]
    if kind == "raise":
        raise KeyError("answer")
    if kind == "hang":
        Path(pidfile[0]).write_text(str(os.getpid()))
        while True:  # a busy loop: only killing the process stops it
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


async def sleepy(prompts, completions, spans=None, **_):
    """Takes 0.5 s of waiting (not CPU) per call, then pays 1.0; records its span if asked to."""
    start = time.monotonic()
    await asyncio.sleep(0.5)
    if spans is not None:
        with open(spans[0], "a") as f:  # one short append per call: atomic with O_APPEND
            f.write(f"{os.getpid()} {start!r} {time.monotonic()!r}\n")
    return [1.0] * len(completions)


def read_spans(path) -> list[tuple[int, float, float]]:
    """``(pid, start, end)`` of every ``sleepy`` call that wrote to ``path``."""
    rows = [line.split() for line in Path(path).read_text().splitlines()]
    return [(int(pid), float(start), float(end)) for pid, start, end in rows]
