"""``trainer.dtype=bf16``: bf16 compute under autocast, float32 master weights, optimizer state and logits.

Tolerance: on this tiny Llama (random weights) bf16 logprobs differ from float32 by at most 3.1e-3 nats
over the synthetic step (measured; padded and shared-prefix rows alike); the test allows 1e-2.
``bench/trainer_step.py`` reports the same figure for SmolLM2-135M.
"""

from __future__ import annotations

import pytest
import torch

from relayrl.trainer.precision import autocast
from tests.trainer.test_packing import PADDED, SHARED, local_actor, step_share, synthetic_groups

BF16_LOGPROB_TOL = 1e-2


@pytest.mark.parametrize("mode", [PADDED, SHARED], ids=["padded", "shared_prefix"])
def test_bf16_logprobs_close_to_fp32_and_really_bf16(one_rank_group, tiny_llama, mode):
    share = step_share(synthetic_groups())
    fp32, bf16 = local_actor(tiny_llama, **mode), local_actor(tiny_llama, dtype="bf16", **mode)
    worst = 0.0
    for a, b in zip(fp32._micro_batches(share), bf16._micro_batches(share)):
        logits, _, _ = bf16.policy_step.forward(bf16.model, b)
        assert logits.dtype == torch.float32  # LM head kept in float32
        lp32, lp16 = fp32.policy_step.logprobs(fp32.model, a), bf16.policy_step.logprobs(bf16.model, b)
        diff = (lp32 - lp16).abs() * a.loss_mask
        worst = max(worst, float(diff.max()))
    assert 0.0 < worst < BF16_LOGPROB_TOL  # > 0: the matmuls did run in bf16


def test_bf16_step_keeps_fp32_master_weights_and_learns(one_rank_group, tiny_llama):
    actor = local_actor(tiny_llama, dtype="bf16", **SHARED)
    before = {n: p.detach().clone() for n, p in actor.model.named_parameters()}
    stats = actor.train_step([synthetic_groups()])
    assert stats["sequences"] == 12.0 and stats["grad_norm"] > 0
    assert all(p.dtype == torch.float32 for p in actor.model.parameters())
    moments = [s for state in actor.optimizer.state.values() for k, s in state.items() if k.startswith("exp_avg")]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    changed = [n for n, p in actor.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(changed) == len(before)


def test_autocast_switch():
    x, w = torch.randn(2, 4), torch.randn(4, 4)
    with autocast("cpu", "bf16"):
        assert (x @ w).dtype == torch.bfloat16
    with autocast("cpu", "float32"):
        assert (x @ w).dtype == torch.float32
    with pytest.raises(ValueError, match=r"trainer\.dtype"), autocast("cpu", "fp16"):
        pass
