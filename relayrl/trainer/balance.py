"""Data-parallel shares by cost: which dp rank trains which packing unit, and how even that came out.

A packed micro-batch costs its row's tokens (attention and every linear scale with them), not its row
count, so equal row counts can leave one rank with twice another's work while the rest wait for it at
the next collective. Every dp rank runs ``assign_lpt`` on the same costs (the step's batch is identical
on all ranks), so they agree on the assignment without communicating.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

TARGET_IMBALANCE = 1.05
"""``split_units`` cuts units while the busiest rank holds more than this times the mean."""


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


def improve(costs: Sequence[int], owner: list[int], ranks: int) -> list[int]:
    """``owner`` after moves and swaps of units between the busiest and the least-loaded rank, each the first
    found that lowers the busier of the two, at most 4 x units of them. Deterministic.

    Costs [5, 5, 4, 3, 3] over 2 ranks: LPT's loads 5 + 4 = 9 | 5 + 3 + 3 = 11; swapping a 3 for the 4 gives
    10 | 10."""
    owner = list(owner)
    for _ in range(4 * len(costs)):
        load = loads(costs, owner, ranks)
        hi = max(range(ranks), key=lambda r: (load[r], -r))
        lo = min(range(ranks), key=lambda r: (load[r], r))
        theirs = [None, *(v for v in range(len(costs)) if owner[v] == lo)]
        change = next(
            (
                (u, v)
                for u in range(len(costs))
                if owner[u] == hi
                for v in theirs
                if 0 < costs[u] - (costs[v] if v is not None else 0) < load[hi] - load[lo]
            ),
            None,
        )
        if change is None:
            break
        u, v = change
        owner[u] = lo
        if v is not None:
            owner[v] = hi
    return owner


def loads(costs: Sequence[int], owner: Sequence[int], ranks: int) -> list[int]:
    """Each rank's summed cost under ``owner``."""
    out = [0] * ranks
    for c, o in zip(costs, owner):
        out[o] += c
    return out


def split_units(
    units: list[list[int]],
    cost_of: Callable[[list[int]], int],
    ranks: int,
    target: float = TARGET_IMBALANCE,
) -> tuple[list[list[int]], list[int]]:
    """(units, owners): ``units`` assigned (``assign_lpt``, then ``improve``); while the busiest rank holds over
    ``target`` times the mean, one unit of several rows is cut in two halves (each costs ``cost_of`` its rows: a
    group's half carries its own copy of the shared prefix) and the units are assigned again. Each round tries
    every such unit and keeps the cut that leaves the lowest busiest load (ties: the earlier unit); a round whose
    best cut does not lower it ends the search. Deterministic, so every rank agrees.

    Units [0, 1, 2, 3] (cost 10 as one, 6 a half, 4 a row) and [4] (cost 2) over 2 ranks: loads 10, 2
    (1.67x); cut in halves: 6 + 2 | 6, loads 8, 6 (1.14x); the next best cut ([0, 1] into rows: costs 4, 4,
    6, 2, LPT loads 8, 8) does not lower 8, so the search ends at 8, 6."""
    units = [list(u) for u in units]
    costs = [cost_of(u) for u in units]
    owner = improve(costs, assign_lpt(costs, ranks), ranks)
    for _ in range(sum(len(u) for u in units)):
        best = max(loads(costs, owner, ranks))
        if token_imbalance(loads(costs, owner, ranks)) <= target:
            break
        trials = []
        for u in (i for i in range(len(units)) if len(units[i]) > 1):
            half = len(units[u]) // 2
            cut = [*units[:u], units[u][:half], units[u][half:], *units[u + 1 :]]
            cut_costs = [*costs[:u], cost_of(cut[u]), cost_of(cut[u + 1]), *costs[u + 1 :]]
            cut_owner = improve(cut_costs, assign_lpt(cut_costs, ranks), ranks)
            trials.append((max(loads(cut_costs, cut_owner, ranks)), u, cut, cut_costs, cut_owner))
        if not trials or min(trials, key=lambda x: (x[0], x[1]))[0] >= best:
            break
        _, _, units, costs, owner = min(trials, key=lambda x: (x[0], x[1]))
    return units, owner
