"""Packed attention per span equals attention through the dense [N, N] mask (the oracle), shared prefixes
included: outputs and the gradients of q, k and v, on random tensors and through the tiny Llama."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from relayrl.trainer.attention import packed_attention, packed_spans, spans, use_packed_attention
from relayrl.trainer.packing import attention_allowed, pack_rows
from tests.trainer.test_packing import plain_model

# segment 0: a plain sequence of 2; segment 1: prefix of 2, suffix A (1 token), suffix B (2 tokens);
# segment 2: a group with no common prefix (two suffixes only); segment 3: a plain sequence of 3
SEGMENT = torch.tensor([0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3])
BRANCH = torch.tensor([0, 0, 0, 0, 1, 2, 2, 1, 2, 2, 0, 0, 0])


def test_spans_by_hand():
    assert spans(SEGMENT, BRANCH) == (
        (0, 2, 0, 0),
        (2, 4, 2, 2),
        (4, 5, 2, 4),  # A: the prefix [2, 4) then itself
        (5, 7, 2, 4),
        (7, 8, 7, 7),  # no prefix in segment 2: each suffix alone
        (8, 10, 8, 8),
        (10, 13, 10, 10),
    )


def _dense(q, k, v):
    """The oracle: SDPA over the whole row with the dense mask, KV heads repeated: [1, N, H, D]."""
    rep = q.shape[1] // k.shape[1]
    mask = attention_allowed(SEGMENT, BRANCH)[None, None]
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask)
    return out.transpose(1, 2)


def test_packed_attention_equals_the_dense_mask_forward_and_backward():
    g = torch.Generator().manual_seed(0)
    n = len(SEGMENT)
    q, k, v = (torch.randn(1, h, n, 8, generator=g, requires_grad=True) for h in (4, 2, 2))  # GQA 4 : 2
    dense = _dense(q, k, v)
    grads_dense = torch.autograd.grad((dense * torch.arange(n)[None, :, None, None]).sum(), (q, k, v))
    ours, _ = packed_attention(torch.nn.Module(), q, k, v, None, packed_spans=spans(SEGMENT, BRANCH))
    grads_ours = torch.autograd.grad((ours * torch.arange(n)[None, :, None, None]).sum(), (q, k, v))
    torch.testing.assert_close(ours, dense, atol=1e-5, rtol=0)
    for a, b in zip(grads_ours, grads_dense):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # sensitive: the same row as one causal span attends across sequences
    leak, _ = packed_attention(torch.nn.Module(), q, k, v, None, packed_spans=((0, n, 0, 0),))
    assert (leak - dense).abs().max() > 1e-2


def test_a_packed_row_through_the_model_equals_the_dense_mask_oracle(tiny_llama):
    """Logits of a packed row with shared prefixes: relayrl's attention against transformers' sdpa fed the
    dense [1, 1, N, N] mask (the path the trainer took before; kept here only as the oracle)."""
    seqs = [[5, 6, 7, 8], [9, 10, 11, 12, 13], [9, 10, 11, 4], [3, 4, 5]]
    mask = torch.tensor([[1.0] * (len(s) - 1) + [0.0] * (5 - len(s)) for s in seqs])  # [4, 4]
    row = pack_rows(seqs, [[0], [1, 2], [3]], mask, target_start=0, share_prefix=True)
    assert row.branch.tolist() == [0] * 4 + [0, 0, 0, 1, 1, 2] + [0] * 3  # group 1 shares [9, 10, 11]
    oracle = plain_model(tiny_llama)
    ours = use_packed_attention(plain_model(tiny_llama))
    dense = attention_allowed(row.segment, row.branch)[None, None]
    with torch.no_grad():
        expected = oracle(input_ids=row.input_ids, position_ids=row.position_ids, attention_mask=dense).logits
        got = ours(input_ids=row.input_ids, position_ids=row.position_ids, packed_spans=packed_spans(ours, row)).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_packed_rows_refuse_a_model_on_another_attention(tiny_llama):
    row = pack_rows([[5, 6, 7]], [[0]], torch.ones(1, 2), target_start=0, share_prefix=False)
    with pytest.raises(ValueError, match="packed attention"):
        packed_spans(plain_model(tiny_llama), row)
