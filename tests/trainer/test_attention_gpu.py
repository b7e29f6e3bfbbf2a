"""Packed attention on CUDA (per-span SDPA: causal, or a lower-right causal bias after a shared prefix, which
dispatches to the fused kernels) against the CPU dense-mask oracle; skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from relayrl.trainer.attention import packed_attention, spans
from tests.trainer.test_attention import BRANCH, SEGMENT, _dense

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_packed_attention_on_cuda_equals_the_cpu_oracle(dtype, atol):
    g = torch.Generator().manual_seed(0)
    n = len(SEGMENT)
    q, k, v = (torch.randn(1, h, n, 64, generator=g, requires_grad=True) for h in (4, 2, 2))  # GQA 4 : 2
    weight = torch.arange(n)[None, :, None, None].float()
    dense = _dense(q, k, v)
    grads_dense = torch.autograd.grad((dense * weight).sum(), (q, k, v))
    qg, kg, vg = (x.detach().to("cuda", dtype).requires_grad_() for x in (q, k, v))
    on_gpu = (qg, kg, vg)
    ours, _ = packed_attention(torch.nn.Module(), qg, kg, vg, None, packed_spans=spans(SEGMENT, BRANCH))
    grads_ours = torch.autograd.grad((ours.float() * weight.cuda()).sum(), on_gpu)
    torch.testing.assert_close(ours.float().cpu(), dense, atol=atol, rtol=0)
    for a, b in zip(grads_ours, grads_dense):
        torch.testing.assert_close(a.float().cpu(), b, atol=atol * 4, rtol=0)
