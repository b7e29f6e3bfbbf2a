"""``bench/weight_sync.py``'s pull figures: what each checksum costs on the payload, and pull beside push.

The ``pull`` backend publishes every version to a store and each engine reads and checks it, so beside a push
of the same bytes it pays a write into the store, a read out of it and a checksum on each side. The issue's goal
(swarm, item 3): on one host a pull sync costs at most ``GOAL`` times a push sync of the same weights. Both pushes
are printed: ``shm`` (one host's fastest) and ``broadcast`` (the push that crosses hosts, which pull stands in for
where no push reaches).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import blake3
import torch
import xxhash

GOAL = 1.2
PUSHES = ("shm", "broadcast")
HASHES: dict[str, Callable[[Any], Any]] = {
    "xxh3_128": lambda b: xxhash.xxh3_128(b).digest(),
    "blake3": lambda b: blake3.blake3(b).digest(),
    "sha256": lambda b: hashlib.sha256(b).digest(),
    "blake2b": lambda b: hashlib.blake2b(b).digest(),
}
"""The checksum the store uses (xxh3_128, ``relayrl/weightsync/store.py`` says why) and the strong hashes it was
weighed against; one thread each, as the store hashes."""


def hash_line(nbytes: int, memcpy_gbps: float) -> None:
    """GB/s of each checksum over ``nbytes`` (best of 3), and its time beside one memcpy of the same bytes."""
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8).numpy()
    parts = []
    for name, fn in HASHES.items():
        best = min(_timed(lambda fn=fn: fn(data)) for _ in range(3))
        parts.append(f"{name} {nbytes / best / 1e9:.2f} GB/s ({best * memcpy_gbps * 1e9 / nbytes:.1f}x memcpy)")
    print(f"    checksums of the payload, one thread, best of 3: {'; '.join(parts)}")


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def ratio_lines(totals: dict[str, float], what: str) -> dict[str, float]:
    """Print pull's total over each push's (rows keyed by ``label``: default threads only); return the ratios."""
    ratios = {push: totals["pull"] / totals[push] for push in PUSHES if push in totals and "pull" in totals}
    for push, ratio in ratios.items():
        print(
            f"    pull / {push} ({what}): {totals['pull'] * 1e3:.0f} / {totals[push] * 1e3:.0f} ms = {ratio:.2f}x "
            f"(goal <= {GOAL}x)"
        )
    return ratios


def verdict(ratios: dict[str, float], what: str, line: Callable[[str, str, bool], None]) -> None:
    for push, ratio in ratios.items():
        line(f"pull sync <= {GOAL}x {push} push ({what})", f"{ratio:.2f}x", ratio <= GOAL)
