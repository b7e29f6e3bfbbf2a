"""Packed-row attention at the cost of the pairs that may attend: one causal SDPA per span, no [N, N] mask.

A packed row (``packing.py``) is a run of segments; each segment is one sequence, or one group's shared
prefix followed by its sequences' suffixes (branches). The rule ``packing.attention_allowed`` states as a
dense mask splits into *spans*, each a contiguous run of queries that attends causally over one contiguous
context::

    whole sequence / shared prefix [a, a+c)      queries [a, a+c)   keys [a, a+c)             causal
    branch i of that prefix, [b, e)              queries [b, e)     keys [a, a+c) ++ [b, e)   causal

A branch's attention is the causal attention of the sequence ``prefix ++ suffix_i`` restricted to its
last ``e - b`` queries, so each span is one ``scaled_dot_product_attention(is_causal=True)`` over that
concatenation, keeping the span's own outputs (the prefix queries it recomputes get no gradient through
it; the prefix span's own outputs carry theirs). Cost: ``sum over spans of (len + prefix)^2 / 2`` pairs,
against ``N^2`` for the dense mask, and memory O(N) with the fused CPU/GPU kernels. Exact: each output is
the softmax over exactly the allowed keys (``tests/trainer/test_attention.py`` against the dense mask).

It is registered in transformers' ``AttentionInterface`` as ``relayrl_packed`` (``use_packed_attention``)
and reads the row's spans from the ``packed_spans`` keyword that the model's forward passes down to every
attention call. Without spans (right-padded rows: the padded micro-batches, the critic's padded path) it
is plain causal SDPA; right padding makes that exact at every real token, as no real token sees a pad.
No mask function is registered under the name, so transformers builds no [N, N] mask for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from relayrl.trainer.packing import PackedRow

NAME = "relayrl_packed"
Span = tuple[int, int, int, int]  # (query start, query end, prefix start, prefix end): keys prefix ++ queries


def spans(segment: torch.Tensor, branch: torch.Tensor) -> tuple[Span, ...]:
    """The row's spans (module docstring) from its ``segment`` [N] and ``branch`` [N] ids, in row order.

    A run of equal (segment, branch) is one span; branch 0 is a segment's prefix (or whole sequence), a
    later branch of the same segment attends to that prefix."""
    seg, br = segment.tolist(), branch.tolist()
    out: list[Span] = []
    prefix = (0, 0)
    start = 0
    for i in range(1, len(seg) + 1):
        if i < len(seg) and seg[i] == seg[start] and br[i] == br[start]:
            continue
        if br[start] == 0:
            prefix = (start, i)
            out.append((start, i, start, start))
        else:
            out.append((start, i, *prefix) if seg[prefix[0]] == seg[start] else (start, i, start, start))
        start = i
    return tuple(out)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """Causal SDPA with KV heads repeated to the query heads (GQA): [B, H, n, D] x [B, Hkv, n, D] -> [B, H, n, D]."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, N, D]
    key: torch.Tensor,  # [B, Hkv, N, D]
    value: torch.Tensor,  # [B, Hkv, N, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    packed_spans: tuple[Span, ...] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature; returns ([B, N, H, D], no weights). See the module docstring."""
    if dropout:
        raise ValueError("relayrl's packed attention runs without dropout (the trainer is in eval mode)")
    if packed_spans is None:
        if attention_mask is not None:
            raise ValueError(
                "relayrl_packed attention got a mask: pass packed_spans for packed rows, right-padded rows need no mask"
            )
        return _sdpa(query, key, value, scaling).transpose(1, 2).contiguous(), None
    if query.shape[0] != 1:
        raise ValueError(f"packed_spans describe one row, the batch has {query.shape[0]}")
    parts = []
    for q0, q1, p0, p1 in packed_spans:
        qs, ks, vs = (_context(x, q0, q1, p0, p1) for x in (query, key, value))
        parts.append(_sdpa(qs, ks, vs, scaling)[:, :, p1 - p0 :])
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def _context(x: torch.Tensor, q0: int, q1: int, p0: int, p1: int) -> torch.Tensor:
    """A span's sequence ``x[p0:p1] ++ x[q0:q1]`` along the sequence axis of [B, H, N, D]."""
    return x[:, :, q0:q1] if p0 == p1 else torch.cat([x[:, :, p0:p1], x[:, :, q0:q1]], dim=2)


def attn_implementation(model: torch.nn.Module) -> str:
    """The attention kernel an HF model runs (``config._attn_implementation``: "sdpa", "relayrl_packed", ...)."""
    # torch types a Module's attributes as Tensor | Module; an HF model's ``config`` is a PretrainedConfig
    return cast("PretrainedConfig", model.config)._attn_implementation


def packed_spans(model: torch.nn.Module, row: PackedRow) -> tuple[Span, ...]:
    """The spans of ``row`` for ``model``'s forward; refuses a model on another attention, which would
    attend across the row's sequences."""
    if attn_implementation(model) != NAME:
        raise ValueError(
            f"packed rows need relayrl's packed attention, the model runs {attn_implementation(model)!r}; "
            "load it with hf.load_sharded (or attention.use_packed_attention(model))"
        )
    return spans(row.segment, row.branch)


def use_packed_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Register ``relayrl_packed`` with transformers and switch ``model`` (an HF model) to it, in place."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, packed_attention)
    cast(Any, model).set_attn_implementation(NAME)
    return model
