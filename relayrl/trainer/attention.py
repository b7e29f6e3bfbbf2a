"""Packed-row attention at the cost of the pairs that may attend: attention per span, no [N, N] mask.

A packed row (``packing.py``) is a run of segments; each segment is one sequence, or one group's shared
prefix followed by its sequences' suffixes (branches). The rule ``packing.attention_allowed`` states as a
dense mask splits into *spans*, each a contiguous run of queries that attends causally over one contiguous
context::

    whole sequence / shared prefix [a, a+c)      queries [a, a+c)   keys [a, a+c)             causal
    branch i of that prefix, [b, e)              queries [b, e)     keys [a, a+c) ++ [b, e)   causal

Each span is computed as its queries over two blocks of keys (``span_attention``): the *past* (the
prefix, and under context parallelism the span's own earlier positions held by other ranks), every key
visible, and the span's *own* keys, causal. On CPU the two blocks run as torch's flash kernels and merge
by their logsumexps, forward and backward (``_PastThenOwn``); on GPU as one SDPA with a lower-right
causal bias. Cost: ``sum over spans of n (p + n / 2)`` query-key pairs for n queries and p past keys,
against ``N^2`` for the dense mask; memory O(N). Exact: each output is the softmax over exactly the
allowed keys (``tests/trainer/test_attention.py`` against the dense mask, gradients included).

It is registered in transformers' ``AttentionInterface`` as ``relayrl_packed`` (``use_packed_attention``)
and reads the row's spans from the ``packed_spans`` keyword that the model's forward passes down to every
attention call. Without spans (right-padded rows: the padded micro-batches, the critic's padded path) it
is plain causal SDPA; right padding makes that exact at every real token, as no real token sees a pad.
No mask function is registered under the name, so transformers builds no [N, N] mask for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch.distributed import ProcessGroup
from torch.distributed.nn.functional import all_gather

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


@dataclass(frozen=True)
class Shard:
    """Context parallelism (``context.py``): this rank holds row positions [start, end) of the row; the
    others' keys and values come over ``group`` (an all-gather in every attention call)."""

    group: ProcessGroup
    start: int
    end: int


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, Hkv, n, D] -> [B, heads, n, D]: KV heads repeated to the query heads (GQA)."""
    rep = heads // x.shape[1]
    return x.repeat_interleave(rep, dim=1) if rep > 1 else x


def span_attention(
    q: torch.Tensor, k_past: torch.Tensor, v_past: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """Queries q [B, H, n, D] over keys ``past ++ own``: every one of the p past keys is visible, the n own
    keys causally (query i sees own keys 0..i). [B, Hkv, *, D] keys and values; returns [B, H, n, D].

    Without past keys it is one causal SDPA. With them, on CPU: the two blocks' flash attentions merged by
    their logsumexps (``_PastThenOwn``); on GPU: one SDPA with a lower-right causal bias, which dispatches
    to the fused kernels. Neither builds an [n, p + n] mask on its fast path."""
    heads = q.shape[1]
    k, v = _repeat_kv(k, heads), _repeat_kv(v, heads)
    if k_past.shape[2] == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    k_past, v_past = _repeat_kv(k_past, heads), _repeat_kv(v_past, heads)
    if q.device.type == "cpu":
        # the flash ops are called directly, so autocast's cast for SDPA (to its dtype) is done here
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else q.dtype
        args = (x.to(dtype) for x in (q, k_past, v_past, k, v))
        return cast(torch.Tensor, _PastThenOwn.apply(*args, scale))
    from torch.nn.attention.bias import causal_lower_right

    keys, values = torch.cat([k_past, k], dim=2), torch.cat([v_past, v], dim=2)
    bias = causal_lower_right(q.shape[2], keys.shape[2])
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=scale)


class _PastThenOwn(torch.autograd.Function):
    """CPU: attention over (past: all visible) ++ (own: causal) from torch's CPU flash kernels.

    Forward: each block's flash attention gives (o_b, lse_b); the softmax over both blocks is
    ``o = sum_b exp(lse_b - lse) o_b`` with ``lse = logaddexp(lse_past, lse_own)``. Backward: each block's
    flash backward given the *merged* o and lse. That is exact: the flash backward rebuilds its block's
    probabilities as exp(s - lse) and the softmax correction from rowsum(do * o), and with the merged
    values those are the whole softmax's, so each block gets its share of the full gradient (the ring
    attention backward, here over two blocks of one rank)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k_past: torch.Tensor,
        v_past: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None,
    ) -> torch.Tensor:
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        o_past, lse_past = flash(q, k_past, v_past, 0.0, False, scale=scale)
        o_own, lse_own = flash(q, k, v, 0.0, True, scale=scale)
        lse = torch.logaddexp(lse_past, lse_own)
        out = o_past * (lse_past - lse).exp()[..., None].to(o_past.dtype)
        out = out + o_own * (lse_own - lse).exp()[..., None].to(o_own.dtype)
        out, lse = _flash_layout(out), _flash_layout(lse)
        ctx.save_for_backward(q, k_past, v_past, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k_past, v_past, k, v, out, lse = ctx.saved_tensors
        back = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        grad = _flash_layout(grad)
        dq_past, dk_past, dv_past = back(grad, q, k_past, v_past, out, lse, 0.0, False, scale=ctx.scale)
        dq_own, dk, dv = back(grad, q, k, v, out, lse, 0.0, True, scale=ctx.scale)
        return dq_past + dq_own, dk_past, dv_past, dk, dv, None


def _flash_layout(x: torch.Tensor) -> torch.Tensor:
    """``x`` [B, H, n, ...] laid out in memory as [B, n, H, ...], as the CPU flash kernels write theirs."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, n, D]
    key: torch.Tensor,  # [B, Hkv, n, D]
    value: torch.Tensor,  # [B, Hkv, n, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    packed_spans: tuple[Span, ...] | None = None,
    context_shard: Shard | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature; returns ([B, n, H, D], no weights). See the module docstring;
    with ``context_shard`` the n positions are the shard's and the keys come from every shard."""
    if dropout:
        raise ValueError("relayrl's packed attention runs without dropout (the trainer is in eval mode)")
    if kwargs.get("sliding_window"):
        raise ValueError("relayrl's packed attention has no sliding window; train models with full attention")
    if packed_spans is None:
        if attention_mask is not None or context_shard is not None:
            raise ValueError(
                "relayrl_packed attention got a mask: pass packed_spans for packed rows, right-padded rows need no mask"
            )
        return F.scaled_dot_product_attention(
            query, _repeat_kv(key, query.shape[1]), _repeat_kv(value, query.shape[1]), is_causal=True, scale=scaling
        ).transpose(1, 2).contiguous(), None
    if query.shape[0] != 1:
        raise ValueError(f"packed_spans describe one row, the batch has {query.shape[0]}")
    start, end = 0, query.shape[2]
    if context_shard is not None:
        start, end = context_shard.start, context_shard.end
        key, value = (torch.cat(all_gather(x.contiguous(), group=context_shard.group), dim=2) for x in (key, value))
    parts = []
    for q0, q1, p0, p1 in packed_spans:
        a, b = max(q0, start), min(q1, end)  # the span's queries on this shard
        if a >= b:
            continue
        k_past, v_past = (torch.cat([x[:, :, p0:p1], x[:, :, q0:a]], dim=2) for x in (key, value))
        qs = query[:, :, a - start : b - start]
        parts.append(span_attention(qs, k_past, v_past, key[:, :, a:b], value[:, :, a:b], scaling))
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


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
