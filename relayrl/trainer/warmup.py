"""A trainer step's allocations made before the first real step, while the engines start.

On a CPU host the first steps of a run spend much of their time in the kernel, not in compute: every
tensor the step allocates for the first time (activations, vocab-wide logits and their gradients, AdamW's
moments and temporaries) is memory the process has never touched, and each of its pages faults in. Measured
on this 2-core box (SmolLM2-135M, grpo_arith): the first two updates of a run took 9.5-10 s against 5 s once
warm, with 100k page faults and ~1.2 s of system time per second. ``CPU_MALLOC_ENV`` keeps freed memory
in the process's heap, so a step made once is not paid for again; this module makes that step early, during
engine start-up, on a dummy batch of the largest shape the run will train, at learning rate 0 (no weight
moves), and then drops AdamW's state so the first real step starts it afresh, as without a warm-up.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from relayrl.types import Trajectory, TrajectoryGroup, VersionSpan


def warmup_groups(groups: int, group_size: int, prompt_tokens: int, completion_tokens: int,
                  vocab_size: int) -> list[TrajectoryGroup]:
    """``groups`` groups of ``group_size`` completions of ``completion_tokens`` tokens after one prompt of
    ``prompt_tokens``: a step's largest shape. Token ids are a fixed pattern (no RNG is drawn); rewards
    alternate 0/1 so every group has a spread (dynamic sampling keeps it, advantages are non-zero)."""
    def ids(n: int, offset: int) -> list[int]:
        return [3 + (offset + 7919 * i) % (vocab_size - 3) for i in range(n)]

    out = []
    for p in range(groups):
        prompt = ids(prompt_tokens, p)
        trajs = [Trajectory(p, s, prompt, ids(completion_tokens, 1000 * (p + 1) + s), [-1.0] * completion_tokens,
                            "", "length", [VersionSpan(0, 0, completion_tokens)], reward=float(s % 2))
                 for s in range(group_size)]
        out.append(TrajectoryGroup(p, "", {}, trajs))
    return out


@contextmanager
def zero_lr(optimizers: list[torch.optim.Optimizer]) -> Iterator[None]:
    """Every param group's learning rate at 0 inside the block (AdamW then moves no parameter: its update
    and its decoupled weight decay are both scaled by the learning rate), restored after."""
    saved = [[g["lr"] for g in opt.param_groups] for opt in optimizers]
    try:
        for opt in optimizers:
            for g in opt.param_groups:
                g["lr"] = 0.0
        yield
    finally:
        for opt, lrs in zip(optimizers, saved):
            for g, lr in zip(opt.param_groups, lrs):
                g["lr"] = lr
