"""Padding-free rows and shared-prefix groups: the index math of one packed forward, no model in here.

A micro-batch of ``b`` sequences (``x_r``, length ``n_r``; loss columns ``[b, T]`` that start at
``target_start``, column ``t`` scoring ``x_r[target_start + t + 1]``) becomes *one* row of real tokens:

    plain packing:   x_1 | x_2 | x_3 ...                      position ids restart at 0 per sequence
    shared prefix:   p | s_1 | s_2 | ... | s_G | next group    p = the longest common prefix of the group's
                                                              sequences (the prompt, and more when every
                                                              completion begins alike); s_i = x_i[len(p):],
                                                              its position ids continue at len(p)

Each token carries a *segment* (one sequence, or one group) and a *branch* (0 for tokens every sequence
of the segment sees: the shared prefix, or a whole unshared sequence; ``i + 1`` for sequence i's suffix).
Query q may attend key k iff

    segment[k] == segment[q]  and  k <= q  and  (branch[k] == 0  or  branch[k] == branch[q])

so no token sees another sequence, a suffix sees the prefix and its own earlier tokens, and with the
position ids of the unpacked sequence each token's hidden state equals the plain per-sequence one (masked
keys get exactly zero weight in the softmax, so only the summation order can differ).

The loss needs logits at a few positions only: an *entry* is (hidden position in the row, target token).
A position inside the shared prefix whose target is also shared is one entry for all G sequences (its
gradient is then the sum of theirs, as G separate copies would give); the last prefix position scores a
different next token per sequence, so it has one entry per sequence. ``gather[r, t]`` names the entry of
loss column t of sequence r (-1: not scored), and ``place`` turns per-entry values back into the ``[b, T]``
layout every loss, normaliser and statistic already uses: those never see the packing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedRow:
    """One micro-batch as a single padding-free row (see the module docstring)."""

    input_ids: torch.Tensor  # [1, N] the tokens of every sequence (shared prefixes once)
    position_ids: torch.Tensor  # [1, N] positions within each sequence
    segment: torch.Tensor  # [N] which sequence / group a token belongs to
    branch: torch.Tensor  # [N] 0 = seen by the whole segment, i + 1 = sequence i's own suffix
    score_pos: torch.Tensor  # [K] row position whose hidden state scores entry k
    score_target: torch.Tensor  # [K] the token entry k scores
    gather: torch.Tensor  # [b, T] entry of each loss column, -1 where nothing is scored

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device) -> PackedRow:
        return PackedRow(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def attention_allowed(segment: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """The rule of the module docstring: [N], [N] -> [N, N] bool, ``allowed[q, k]``. The dense statement of
    what ``attention.py`` computes per span: the tests' oracle, never built by the trainer (it is N^2)."""
    n = segment.shape[0]
    order = torch.arange(n, device=segment.device)
    causal = order[None, :] <= order[:, None]  # k <= q
    same = segment[None, :] == segment[:, None]
    visible = (branch[None, :] == 0) | (branch[None, :] == branch[:, None])
    return causal & same & visible


def place(values: torch.Tensor, gather: torch.Tensor) -> torch.Tensor:
    """Per-entry values [K, ...] -> the loss layout [b, T, ...], zero where ``gather`` is -1.

    A gather (differentiable): an entry used by several sequences gets the sum of their gradients.
    """
    out = values[gather.clamp(min=0)]  # [b, T, ...]
    valid = (gather >= 0).view(*gather.shape, *([1] * (values.ndim - 1)))
    return torch.where(valid, out, torch.zeros((), dtype=values.dtype, device=values.device))


def common_prefix_len(seqs: list[list[int]]) -> int:
    """Length of the longest prefix all of ``seqs`` share."""
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != seqs[0][i] for s in seqs[1:]):
            return i
    return n


def segment_tokens(seqs: list[list[int]], share_prefix: bool) -> int:
    """Tokens one segment of ``seqs`` takes in a packed row: ``C + sum(n_i - C)``, C the shared prefix."""
    c = common_prefix_len(seqs) if share_prefix and len(seqs) > 1 else 0
    return c + sum(len(s) - c for s in seqs)


def _span(mask_row: torch.Tensor) -> tuple[int, int] | None:
    cols = mask_row.nonzero()
    return (int(cols[0]), int(cols[-1])) if len(cols) else None


def pack_rows(
    seqs: list[list[int]], segments: list[list[int]], loss_mask: torch.Tensor, target_start: int, share_prefix: bool
) -> PackedRow:
    """Pack sequences ``seqs`` (row r of the micro-batch is ``seqs[r]``) into one row.

    ``segments`` partitions the row indexes into consecutive runs; with ``share_prefix`` a run of 2 or
    more (one group's sequences) shares its common prefix, otherwise every sequence is its own segment.
    ``loss_mask`` [b, T]: each sequence is scored from its first to its last loss column (as the padded
    forward, which scores every column; positions in between with a 0 mask, e.g. environment tokens,
    are scored too and then masked by the loss). At least one entry is always made, so a micro-batch
    without loss tokens still gives a loss with a graph (and a backward, which FSDP needs on every rank).
    """
    ids: list[int] = []  # the row's token ids
    pos: list[int] = []  # position ids
    seg: list[int] = []  # segment per position
    br: list[int] = []  # branch per position (0: the shared prefix, i + 1: run[i]'s own tokens)
    entries: dict[tuple[int, int], int] = {}
    gather = torch.full(loss_mask.shape, -1, dtype=torch.long)
    runs = segments if share_prefix else [[r] for run in segments for r in run]
    for s, run in enumerate(runs):
        group = [seqs[r] for r in run]
        c = common_prefix_len(group) if len(run) > 1 else len(group[0])
        base = len(ids)
        ids += group[0][:c]
        pos += range(c)
        seg += [s] * c
        br += [0] * c
        for i, r in enumerate(run):
            start = len(ids)  # row position of x_r[c]
            ids += seqs[r][c:]
            pos += range(c, len(seqs[r]))
            seg += [s] * (len(seqs[r]) - c)
            br += [i + 1] * (len(seqs[r]) - c)
            span = _span(loss_mask[r])
            for t in range(span[0], span[1] + 1) if span else ():
                j = target_start + t  # hidden position scoring x_r[j + 1]
                at = base + j if j < c else start + j - c
                gather[r, t] = entries.setdefault((at, seqs[r][j + 1]), len(entries))
    if not entries:
        entries[(0, ids[0])] = 0
    keys = list(entries)  # dicts keep insertion order = entry index
    return PackedRow(
        input_ids=torch.tensor([ids]),
        position_ids=torch.tensor([pos]),
        segment=torch.tensor(seg),
        branch=torch.tensor(br),
        score_pos=torch.tensor([k[0] for k in keys]),
        score_target=torch.tensor([k[1] for k in keys]),
        gather=gather,
    )


def plan_chunks(costs: list[int], budget: int) -> list[list[int]]:
    """Consecutive units into chunks of at most ``budget`` tokens (greedy; a unit over budget alone)."""
    chunks: list[list[int]] = []
    used = budget + 1
    for u, cost in enumerate(costs):
        if used + cost > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(u)
        used += cost
    return chunks


def split_to_count(chunks: list[list[int]], costs: list[int], count: int) -> list[list[int]]:
    """Split the costliest chunks (at the unit nearest their token midpoint) until there are ``count``.

    Data-parallel ranks must run the same number of forwards (FSDP collectives): a rank with fewer
    chunks than the busiest one splits its own, which keeps every chunk within the budget. Stops early
    when no chunk has two units left (the caller then adds empty micro-batches).
    """
    chunks = [list(c) for c in chunks]
    while len(chunks) < count:
        splittable = [i for i, c in enumerate(chunks) if len(c) > 1]
        if not splittable:
            break
        i = max(splittable, key=lambda k: sum(costs[u] for u in chunks[k]))
        chunk, half, acc, cut = chunks[i], sum(costs[u] for u in chunks[i]) / 2, 0, 1
        for k, u in enumerate(chunk[:-1]):
            acc += costs[u]
            cut = k + 1
            if acc >= half:
                break
        chunks[i : i + 1] = [chunk[:cut], chunk[cut:]]
    return chunks
