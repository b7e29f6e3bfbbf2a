"""Shared-prefix group rows: layout by hand, and equality with the per-sequence forward for the policy's
logprobs (the old-logprob / reference pass is the same ``PolicyStep.logprobs``), gradients, and the
critic's values."""

from __future__ import annotations

import pytest
import torch

from relayrl.trainer.attention import use_packed_attention
from relayrl.trainer.batch import packing_units
from relayrl.trainer.critic import Critic, load_value_model, value_head
from relayrl.trainer.packing import pack_rows, segment_tokens
from tests.trainer.test_packing import (
    PADDED,
    SHARED,
    local_actor,
    max_logprob_error,
    step_loss_and_grads,
    step_share,
    synthetic_groups,
)


def test_shared_prefix_layout_by_hand():
    # one group: prompt [5 6], completions [7 8] and [7 9 4]; common prefix [5 6 7] (C = 3)
    seqs = [[5, 6, 7, 8], [5, 6, 7, 9, 4]]
    loss_mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # target_start=1: column t scores x[t + 2]
    row = pack_rows(seqs, [[0, 1]], loss_mask, target_start=1, share_prefix=True)
    assert row.input_ids.tolist() == [[5, 6, 7, 8, 9, 4]]  # prefix once, then each suffix
    assert row.position_ids.tolist() == [[0, 1, 2, 3, 3, 4]]  # suffixes continue at C
    assert row.branch.tolist() == [0, 0, 0, 1, 2, 2]
    # column 0 (j=1 -> token 7) is shared by both rows: one entry; j=2 scores 8 vs 9 from the same hidden
    # state (two entries); row 1's j=3 scores 4 from its suffix token 9 at row position 4
    assert list(zip(row.score_pos.tolist(), row.score_target.tolist())) == [(1, 7), (2, 8), (2, 9), (4, 4)]
    assert row.gather.tolist() == [[0, 1, -1], [0, 2, 3]]
    assert segment_tokens(seqs, True) == 6 and segment_tokens(seqs, False) == 9


def test_groups_over_budget_are_cut_into_parts_with_their_own_prefix():
    share = step_share(synthetic_groups(n_groups=2, group_size=4))
    whole, _ = packing_units(share, budget=1000, share_prefix=True)
    assert whole == [[0, 1, 2, 3], [4, 5, 6, 7]]
    cut, costs = packing_units(share, budget=16, share_prefix=True)
    assert sorted(r for u in cut for r in u) == list(range(8)) and len(cut) > 2
    assert all(c <= 16 for u, c in zip(cut, costs) if len(u) > 1)


@pytest.mark.parametrize("budget", [16, 24, 1000])
def test_logprobs_and_gradients_equal_for_any_budget(one_rank_group, tiny_llama, budget):
    """16: groups cut into parts; 1000: every group in one row. Against padded rows and sequences alone."""
    share = step_share(synthetic_groups())
    actor = local_actor(tiny_llama, max_tokens_per_micro_batch=budget, shared_prefix=True)
    micro = actor._micro_batches(share)
    assert max_logprob_error(actor, micro, actor.model)[0] < 1e-5
    padded = step_loss_and_grads(local_actor(tiny_llama, micro_batch_size=4, **PADDED), share, "token-mean")
    shared = step_loss_and_grads(actor, share, "token-mean")
    assert abs(padded[0] - shared[0]) < 1e-6 and padded[2:4] == shared[2:4]
    for name, g in padded[1].items():
        assert (shared[1][name] - g).norm() <= 1e-4 * g.norm() + 1e-12, name


def test_prompt_computed_once_per_group(one_rank_group, tiny_llama):
    groups = synthetic_groups()
    share = step_share(groups)
    micro = local_actor(tiny_llama, max_tokens_per_micro_batch=1000, shared_prefix=True)._micro_batches(share)
    expected = sum(
        segment_tokens([t.prompt_token_ids + t.completion_token_ids for t in g.trajectories], True) for g in groups
    )
    assert [mb.packed.n_tokens for mb in micro] == [expected]
    prompts = sum(len(g.trajectories[0].prompt_token_ids) for g in groups)
    assert expected <= int(share.attention_mask.sum()) - 3 * prompts  # each prompt once, not 4 times


@pytest.mark.parametrize(
    "mode", [{"max_tokens_per_micro_batch": 40, "shared_prefix": False}, SHARED], ids=["packed", "shared_prefix"]
)
def test_critic_values_equal_padded(one_rank_group, tiny_llama, mode):
    critic = Critic.__new__(Critic)  # the forward only: no FSDP, no optimizer
    critic.model = use_packed_attention(load_value_model(str(tiny_llama)).eval())  # as Critic loads it
    with torch.no_grad():
        value_head(critic.model).weight.normal_(std=0.05, generator=torch.Generator().manual_seed(0))
    share = step_share(synthetic_groups())
    padded = local_actor(tiny_llama, micro_batch_size=12, **PADDED)._micro_batches(share)
    packed = local_actor(tiny_llama, **mode)._micro_batches(share)
    with torch.no_grad():
        ref = critic._forward(padded[0])  # all 12 rows in one padded batch
        packed_values = [critic._forward(mb) for mb in packed]
    assert ref.abs().max() > 0.1  # a head that says something
    rows = 0
    for mb, values in zip(packed, packed_values):
        for r in range(len(mb)):
            full = ref[rows + r]
            for t in mb.loss_mask[r].nonzero().flatten().tolist():
                col = mb.target_start + t - padded[0].target_start
                assert abs(float(values[r, t]) - float(full[col])) < 1e-5
        rows += len(mb)
    assert rows == 12
