"""Data-parallel shares by cost: which dp rank trains which packing unit, and how even that came out.

A packed micro-batch costs its row's tokens (attention and every linear scale with them), not its row
count, so equal row counts can leave one rank with twice another's work while the rest wait for it at
the next collective. Every dp rank runs ``assign_lpt`` on the same costs (the step's batch is identical
on all ranks), so they agree on the assignment without communicating.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def assign_lpt(costs: Sequence[int], ranks: int) -> list[int]:
    """The rank of each unit, by longest-processing-time first (Graham, 1969).

    Rule: the units in decreasing cost (ties: lower unit index first), each onto the rank with the
    least load so far (ties: lower rank). Deterministic, O(n log n); the largest load is at most
    ``4/3 - 1/(3 * ranks)`` times the best possible. Costs [7, 5, 4, 3, 1] over 2 ranks: 7 -> 0,
    5 -> 1, 4 -> 1, 3 -> 0, 1 -> 1, loads [10, 10].
    """
    if ranks < 1:
        raise ValueError(f"ranks={ranks}: a batch needs at least one rank to go to")
    heap = [(0, r) for r in range(ranks)]  # (load, rank): the least-loaded, lowest rank on top
    owner = [0] * len(costs)
    for u in sorted(range(len(costs)), key=lambda u: (-costs[u], u)):
        load, rank = heapq.heappop(heap)
        owner[u] = rank
        heapq.heappush(heap, (load + costs[u], rank))
    return owner


def token_imbalance(tokens: Sequence[float]) -> float:
    """max / mean of the ranks' tokens: 1.0 when every rank has the same work, ``ranks`` when one has all.

    The step runs as long as its busiest rank, so this is the step time over what a perfect split
    would take (if time is proportional to tokens). 1.0 when no rank has any token.
    """
    mean = sum(tokens) / len(tokens)
    return max(tokens) / mean if mean > 0 else 1.0
