"""Gloo ranks in spawned processes, for the benches and tests that run torch.distributed without Ray.

Each rank joins one gloo group through a file store, runs ``worker(rank, *args)``, destroys the group, and leaves
by ``os._exit`` without finalizing its interpreter. After ``distribute_tensor`` something in torch keeps the group
object alive past ``destroy_process_group`` (what, is not found), so gloo's worker threads are still running when the
interpreter finalizes; one still freeing a finished collective's tensors then needs the GIL, and the process aborts
with "terminate called without an active exception" (pytorch/pytorch#190489): 2 runs in 40 of a vocab-parallel
test did so here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def spawn_ranks(worker: Callable[..., None], world_size: int, store: Path, *args: Any) -> None:
    """``worker(rank, *args)`` on ``world_size`` gloo ranks (``store``: a file path no rank has used)."""
    mp.spawn(_rank, args=(worker, world_size, str(store), args), nprocs=world_size, join=True)


def _rank(rank: int, worker: Callable[..., None], world_size: int, store: str, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        worker(rank, *args)
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # an error above leaves through spawn's own exit, which reports it
