"""Context parallelism (``trainer.cp_size = C``): one packed row split over the C ranks of a "cp" group.

The ranks of a cp group hold the same micro-batches (their dp index's share, as tp ranks do). Each packed
row of N tokens is padded to ``C n`` (the pad is a segment of its own, never scored) and rank r runs the
model on positions ``[r n, (r + 1) n)``::

    embeddings, norms, MLPs, projections, RoPE   n tokens, at their global position ids
    every attention call                         the row's keys and values all-gathered over cp
                                                 (``attention.Shard``); rank r's queries attend over them
                                                 span by span, keys of its span held by earlier ranks
                                                 being the span's past block (``attention.py``)
    the LM head                                  the entries whose position is on rank r
    (logprob, entropy) per entry                 all-gathered: every rank holds the row's K entries and
                                                 computes the loss of one unsplit rank

Gradients: ``all_gather``'s backward sums what every rank sends back, so, as each rank's loss is the
whole row's, each rank's parameter gradient is C times its tokens' share of the row's gradient; FSDP2
averages over the dp x cp ranks it shards over, so the step's gradient is exactly the unsplit one with the
backward's dp factor unchanged (``step.PolicyStep.train_micro``). Exact against C = 1 (fp32, 1e-5):
``tests/trainer/test_context.py`` on 2 gloo ranks.

Memory per rank: activations of n = N / C tokens, plus one layer's gathered keys and values at a time
(``2 N H_kv D`` values; kept per layer for the backward unless checkpointed). Time per rank: the
token-wise work of n tokens, and attention for its queries against the keys they see: with this
contiguous split the last rank's queries see the most (a zig-zag split would even that out).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed import ProcessGroup
from torch.distributed.nn.functional import all_gather

from relayrl.trainer.attention import Shard
from relayrl.trainer.packing import PackedRow


@dataclass(frozen=True)
class Group:
    """This rank's place in its cp group."""

    group: ProcessGroup
    rank: int
    size: int


@dataclass(frozen=True)
class RowShard:
    """What rank r runs of one packed row (module docstring)."""

    row: PackedRow  # the whole row padded to C n tokens (every rank holds it; spans come from it)
    input_ids: torch.Tensor  # [1, n] this rank's tokens
    position_ids: torch.Tensor  # [1, n]
    attn: Shard
    score_pos: torch.Tensor  # [K_max] local positions this rank scores: its entries, then pads at 0
    score_target: torch.Tensor  # [K_max]
    counts: tuple[int, ...]  # real entries per rank
    order: torch.Tensor  # [K] entry k's index in the ranks' concatenated real entries


def pad_row(row: PackedRow, size: int) -> PackedRow:
    """``row`` with pad tokens appended up to a multiple of ``size``: token 0, a segment of their own,
    positions from 0; no entry scores them, so losses and spans of the real tokens are unchanged."""
    pad = -row.n_tokens % size
    if pad == 0:
        return row
    ids, pos = row.input_ids, row.position_ids
    tail = torch.arange(pad, dtype=pos.dtype, device=pos.device)
    return PackedRow(
        input_ids=torch.cat([ids, ids.new_zeros(1, pad)], dim=1),
        position_ids=torch.cat([pos, tail[None]], dim=1),
        segment=torch.cat([row.segment, row.segment.new_full((pad,), int(row.segment.max()) + 1)]),
        branch=torch.cat([row.branch, row.branch.new_zeros(pad)]),
        score_pos=row.score_pos,
        score_target=row.score_target,
        gather=row.gather,
    )


def shard_row(row: PackedRow, cp: Group) -> RowShard:
    """Rank ``cp.rank``'s part of ``row``. Pure index math on the row every rank holds: each rank knows
    every rank's entry count, so the entries' all-gather needs no size exchange. Every rank scores the
    same K_max >= 1 positions (its entries, then pads at local position 0 whose results are dropped), so
    each rank's head is in the graph and the ranks' collectives pair up."""
    full = pad_row(row, cp.size)
    n = full.n_tokens // cp.size
    start, end = cp.rank * n, (cp.rank + 1) * n
    owner = torch.div(full.score_pos, n, rounding_mode="floor")  # [K] the rank holding each entry's position
    counts = tuple(int((owner == r).sum()) for r in range(cp.size))
    mine = (owner == cp.rank).nonzero()[:, 0]
    k_max = max(counts)
    pad = k_max - len(mine)
    zeros = full.score_pos.new_zeros(pad)
    return RowShard(
        row=full,
        input_ids=full.input_ids[:, start:end],
        position_ids=full.position_ids[:, start:end],
        attn=Shard(cp.group, start, end),
        score_pos=torch.cat([full.score_pos[mine] - start, zeros]),
        score_target=torch.cat([full.score_target[mine], zeros]),
        counts=counts,
        order=torch.argsort(torch.cat([(owner == r).nonzero()[:, 0] for r in range(cp.size)])),
    )


def gather_entries(local: torch.Tensor, shard: RowShard, cp: Group) -> torch.Tensor:
    """Every rank's scored entries [1, K_max, ...] -> the row's [1, K, ...] in entry order (differentiable:
    the backward sends each rank the gradient of its own entries, summed over the ranks)."""
    parts = all_gather(local.contiguous(), group=cp.group)
    real = torch.cat([p[:, :c] for p, c in zip(parts, shard.counts)], dim=1)
    return real[:, shard.order]
