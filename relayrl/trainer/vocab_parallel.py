"""The embedding and the LM head split by vocabulary over tensor-parallel ranks, as Megatron-LM splits them.

Under ``trainer.tp_size = t`` the rows of the output projection and of the embedding (one parameter when tied) are
split over the t ranks (``tp.split_vocabulary``): rank r holds tokens [r * ceil(V / t), ...) only. The embedding
looks up the tokens of its rows and the lookups are summed over tp (``VocabParallelEmbedding``). A chunk's
logprobs and entropies need, per position, a max and three sums over the vocabulary, each a local reduction and
one all-reduce of ``c`` floats over the tp ranks, never the [c, V] logits on one rank:

    m      = max_r max_v z_rv                          (all-reduce MAX, no gradient: it only steadies exp)
    lse    = log sum_r sum_v exp(z_rv - m) + m         (all-reduce SUM)
    z[t]   = sum_r (z_r[t - offset_r] if t in r's rows else 0)
    E_p[z] = sum_r sum_v exp(z_rv - lse) z_rv           (the entropy's H = lse - E_p[z])

Every tp rank computes the same loss from these sums, so the gradient of each rank's part is the sum's (an
all-reduce forward, identity backward: ``_SumOverTp``). A value every rank holds alike that feeds each rank's
part of a sum (the hidden states; lse inside E_p[z]) takes the sum of all ranks' parts' gradients (identity
forward, all-reduce backward: ``_CopyToTp``); where it is used outside the parts, its gradient is the same on
every rank and is taken as it is. The rest is ``head.py``'s chunking: each chunk under activation
checkpointing, so the backward recomputes its [c, V / t] logits (and runs its all-reduces again, in the same
order on every tp rank).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F


class _SumOverTp(torch.autograd.Function):
    """Forward: the sum over the tp ranks (all-reduce); backward: the gradient as it is."""

    @staticmethod
    def forward(ctx: Any, part: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        total = part.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _CopyToTp(torch.autograd.Function):
    """Forward: the input as it is; backward: the gradient summed over the tp ranks (all-reduce)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


class VocabParallelEmbedding(torch.nn.Embedding):
    """An ``nn.Embedding`` whose weight is split by vocabulary rows over tp (a ``Shard(0)`` DTensor, its class
    swapped in place by ``tp.split_vocabulary``), as Megatron-LM's: each rank looks up the tokens of its own rows
    (zeros for the others') and the lookups are summed over the tp ranks. Its gradient stays its own rows' (torch's
    ``RowwiseParallel`` embedding hands back a whole [V, H] gradient on every rank)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        mesh = weight.device_mesh  # type: ignore[attr-defined]  # a DTensor (split_vocabulary)
        rows = weight.to_local()  # type: ignore[attr-defined]
        offset = row_offset(weight.shape[0], mesh.size(), mesh.get_local_rank())
        local = ids - offset
        inside = (local >= 0) & (local < rows.shape[0])
        pad = None if self.padding_idx is None else self.padding_idx - offset
        pad = pad if pad is not None and 0 <= pad < rows.shape[0] else None
        found = F.embedding(local.clamp(0, rows.shape[0] - 1), rows, pad) * inside[..., None]
        return _SumOverTp.apply(found, mesh.get_group())


def row_offset(vocab: int, tp_size: int, tp_rank: int) -> int:
    """The first vocabulary row of tp rank ``tp_rank`` when ``vocab`` rows are split as ``torch.chunk`` splits them
    (DTensor's ``Shard(0)``): ceil(vocab / tp_size) rows a rank, the last one short (``tp.split_vocabulary``
    refuses a split that leaves a rank none)."""
    return tp_rank * -(-vocab // tp_size)


def chunk_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    tau: float,
    ent: bool,
    group: dist.ProcessGroup,
    offset: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob [c], entropy [c]) of ``c`` positions, as ``head._chunk_stats`` gives them, from this tp rank's
    rows of the head: hidden [c, H] (the same on every tp rank), weight [V_r, H] (rows from ``offset``), targets
    [c] (global token ids)."""
    h = _CopyToTp.apply(hidden.float(), group)
    z = F.linear(h, weight.float(), None if bias is None else bias.float()) / tau  # [c, V_r]
    top = z.detach().amax(-1)
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    lse = _SumOverTp.apply((z - top[:, None]).exp().sum(-1), group).log() + top
    local = targets - offset
    inside = (local >= 0) & (local < z.shape[-1])
    picked = z.gather(-1, local.clamp(0, z.shape[-1] - 1)[:, None])[:, 0]
    logprob = _SumOverTp.apply(torch.where(inside, picked, 0.0), group) - lse
    with torch.set_grad_enabled(ent and torch.is_grad_enabled()):
        zs = z if ent else z.detach()
        total = lse if ent else lse.detach()
        shared = _CopyToTp.apply(total, group)  # used in each rank's part of a sum: its gradient is all parts'
        entropy = total - _SumOverTp.apply(((zs - shared[:, None]).exp() * zs).sum(-1), group)
    return logprob, entropy
