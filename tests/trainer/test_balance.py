"""Token-balanced data-parallel shares: the LPT rule and the imbalance figure by hand, and a step's gradient
that does not depend on how its rows are spread over dp ranks.

The gradient check simulates the dp ranks in one process on the tiny Llama (no FSDP): each rank's packed
micro-batches with the counts and the denominator the all-reduces would give, the backward of each of its
numerators over the step's denominator, summed over ranks, which is what FSDP2's average times dp_size gives.
"""

from __future__ import annotations

import pytest
import torch

from relayrl.config import AlgorithmConfig
from relayrl.monitor.schema import MEMORY_TRAINER_PEAK_GB, TRAINER_TOKEN_IMBALANCE, canonical_name
from relayrl.trainer.balance import assign_lpt, token_imbalance
from relayrl.trainer.batch import (
    balanced_split,
    build_train_batch,
    forward_tokens,
    micro_batches,
    packing_plan,
    split_batch,
)
from relayrl.trainer.step import step_totals
from relayrl.types import TrainBatch
from tests.trainer.test_packing import SHARED, local_actor, synthetic_groups


# ------------------------------------------------------------------------------------------- pure rule
def test_lpt_by_hand():
    # 7 -> rank 0; 5 -> rank 1 (loads 7, 0); 4 -> rank 1 (7, 5); 3 -> rank 0 (7, 9); 1 -> rank 1 (10, 9)
    costs = [7, 5, 4, 3, 1]
    owner = assign_lpt(costs, 2)
    assert owner == [0, 1, 1, 0, 1]
    assert [sum(c for c, o in zip(costs, owner) if o == r) for r in range(2)] == [10, 10]
    # the order units come in does not matter, only their costs and indexes: 5 and 7 swapped swap owners
    assert assign_lpt([5, 7, 4, 3, 1], 2) == [1, 0, 1, 0, 1]


def test_lpt_ties_go_to_the_lower_unit_and_rank():
    assert assign_lpt([2, 2, 2], 2) == [0, 1, 0]  # equal costs: unit order; equal loads: rank order
    assert assign_lpt([4], 3) == [0]  # ranks 1 and 2 get nothing
    assert assign_lpt([], 2) == []
    with pytest.raises(ValueError, match="ranks=0"):
        assign_lpt([1], 0)


def test_token_imbalance_by_hand():
    assert token_imbalance([30, 10]) == 1.5  # max 30 / mean 20
    assert token_imbalance([5, 5]) == 1.0
    assert token_imbalance([12, 0, 0]) == 3.0  # one rank with everything: the rank count
    assert token_imbalance([0, 0]) == 1.0


# ------------------------------------------------------------------------------------------- shares
def _batch() -> TrainBatch:
    """test_batch's hand example: rows of 5, 4 | 4, 2 tokens; groups 10 (prefix [5, 6, 7]) and 11 (prefix [1])."""
    from tests.trainer.test_batch import _groups

    return build_train_batch(_groups(), pad_token_id=0)


def test_rows_go_by_tokens_without_shared_prefix():
    # units are rows, costs 5, 4, 4, 2: 5 -> 0, 4 -> 1, 4 -> 1 (loads 5, 4), 2 -> 0 (5, 8): loads 7, 8
    # (the contiguous split's are 9, 6)
    batch = _batch()
    shares = [balanced_split(batch, r, 2, budget=100, share_prefix=False) for r in range(2)]
    assert torch.equal(shares[0].input_ids, batch.input_ids[[0, 3]])  # rows in batch order
    assert torch.equal(shares[1].input_ids, batch.input_ids[[1, 2]])
    assert [int(s.attention_mask.sum()) for s in shares] == [7, 8]
    assert shares[0].prompt_ids == [10, 11] and torch.equal(shares[0].advantages, batch.advantages[[0, 3]])


def test_a_group_is_cut_when_a_rank_would_wait_and_a_rank_without_a_unit_gets_a_filler():
    # shared prefix: group 10 packs 3 + 2 + 1 = 6 tokens, group 11 1 + 3 + 1 = 5: whole groups over 3 ranks load
    # 6, 5, 0 (1.64x the mean), so group 10 is cut: its rows alone cost 5 and 4 (each with the prefix), loads 5,
    # 5, 4; cutting group 11 next (4 + 2) would load one rank 6, so it stays whole
    batch = _batch()
    shares = [balanced_split(batch, r, 3, budget=100, share_prefix=True) for r in range(3)]
    assert [s.prompt_ids for s in shares] == [[10], [11, 11], [10]]
    assert torch.equal(shares[2].input_ids, batch.input_ids[[1]])
    assert sum(float(s.loss_mask.sum()) for s in shares) == float(batch.loss_mask.sum())
    # 4 ranks: the busiest (5 tokens) can only lose by cutting group 11 (4 + 2: no lower), so the last rank
    # gets a zero-weight copy of row 0
    shares = [balanced_split(batch, r, 4, budget=100, share_prefix=True) for r in range(4)]
    filler = shares[3]
    assert [s.prompt_ids for s in shares] == [[10], [11, 11], [10], [-1]]
    assert torch.equal(filler.input_ids, batch.input_ids[[0]])  # real tokens: attention stays defined
    assert float(filler.loss_mask.sum()) == 0.0 and filler.advantages.tolist() == [0.0]
    assert filler.rewards is not None and filler.rewards.tolist() == [0.0]
    assert float(batch.loss_mask[0].sum()) == 2.0  # the batch is untouched
    with pytest.raises(ValueError, match="rank"):
        balanced_split(batch, 3, 3, budget=100, share_prefix=True)


def test_improve_by_hand():
    """``improve``'s docstring case: LPT's 9 | 11 becomes 10 | 10 by swapping the 4 for a 3."""
    from relayrl.trainer.balance import improve, loads

    costs = [5, 5, 4, 3, 3]
    lpt = assign_lpt(costs, 2)
    assert loads(costs, lpt, 2) == [9, 11]
    assert loads(costs, improve(costs, lpt, 2), 2) == [10, 10]
    assert improve([4, 4], [0, 1], 2) == [0, 1]  # already even: nothing moves


def test_split_units_by_hand():
    """``split_units``' docstring case: [0, 1, 2, 3] costs 10 whole, 6 a half, 4 a row; [4] costs 2."""
    from relayrl.trainer.balance import split_units

    costs = {(0, 1, 2, 3): 10, (0, 1): 6, (2, 3): 6, (0,): 4, (1,): 4, (2,): 4, (3,): 4, (4,): 2}
    assert split_units([[0, 1, 2, 3], [4]], lambda rows: costs[tuple(rows)], 2) == ([[0, 1], [2, 3], [4]], [0, 1, 0])
    # the busiest rank's own group ([0, 1]: 395 over rank 0's 508) cut in halves would leave 516; cutting [3, 4]
    # on the other rank lets LPT reach 505 | 433, and no further cut lowers 505
    costs |= {(0, 1): 395, (0,): 218, (1,): 218, (2,): 113, (3, 4): 185, (3,): 110, (4,): 110}
    costs |= {(5, 6): 210, (5,): 125, (6,): 125}
    units, owner = split_units([[0, 1], [2], [3, 4], [5, 6]], lambda rows: costs[tuple(rows)], 2)
    assert units == [[0, 1], [2], [3], [4], [5, 6]] and owner == [0, 1, 1, 0, 1]
    # already within 1.05: nothing is cut
    costs = {(0, 1): 6, (2, 3): 6}
    assert split_units([[0, 1], [2, 3]], lambda rows: costs[tuple(rows)], 2) == ([[0, 1], [2, 3]], [0, 1])


# ------------------------------------------------------------------------------------------- the step's gradient
def simulated_step(actor, shares: list[TrainBatch]) -> tuple[float, dict[str, torch.Tensor], list[int]]:
    """(loss, gradient, each rank's forward tokens) of one step whose dp ranks hold ``shares``."""
    budget, share_prefix = actor.cfg.max_tokens_per_micro_batch, actor.cfg.shared_prefix
    count = max(len(packing_plan(s, budget, share_prefix)[2]) for s in shares)  # the all-reduce (max)
    ranks = [
        micro_batches(s, 1, budget, share_prefix, torch.device("cpu"), lambda v, op=None: torch.tensor(float(count)))
        for s in shares
    ]
    every = [mb for micro in ranks for mb in micro]
    _, denom = step_totals(every, actor.objective, lambda v: v)  # the sum over ranks, given all their micro-batches
    actor.model.zero_grad(set_to_none=True)
    loss = sum(actor.policy_step.train_micro(actor.model, mb, None, None, denom, 1)[0].loss for mb in every)
    grads = {n: p.grad.clone() for n, p in actor.model.named_parameters() if p.grad is not None}
    return float(loss / denom), grads, [sum(forward_tokens(mb) for mb in micro) for micro in ranks]


@pytest.mark.parametrize("world", [2, 4])
def test_balanced_shares_give_the_gradient_of_the_contiguous_split(one_rank_group, tiny_llama, world):
    """3 groups of 4 with a shared prefix (23, 29, 30 packed tokens), over 2 and 4 ranks: the token-balanced
    shares (groups cut where a rank would wait) train the same gradient as one rank and as the contiguous
    split, and are no less even than it."""
    actor = local_actor(tiny_llama, algo=AlgorithmConfig(group_size=4, entropy_coef=0.01), **SHARED)
    batch = build_train_batch(synthetic_groups(), pad_token_id=0)
    one = simulated_step(actor, [split_batch(batch, 0, 1)])
    contiguous = simulated_step(actor, [split_batch(batch, r, world) for r in range(world)])
    balanced_shares = [balanced_split(batch, r, world, 60, True) for r in range(world)]
    balanced = simulated_step(actor, balanced_shares)
    assert token_imbalance(balanced[2]) <= token_imbalance(contiguous[2])
    assert one[0] != 0.0
    for other in (contiguous, balanced):
        assert abs(other[0] - one[0]) < 1e-6
        assert other[1].keys() == one[1].keys()
        for name, g in one[1].items():
            assert (other[1][name] - g).norm() <= 1e-5 * g.norm() + 1e-12, name
    print(f"world {world} forward tokens: contiguous {contiguous[2]}, balanced {balanced[2]}")


def test_train_step_reports_the_imbalance_and_peak_memory(one_rank_group, tiny_llama):
    """One rank is trivially balanced (1.0); the peak is only checked to be there (it is the process's)."""
    stats = local_actor(tiny_llama, **SHARED).train_step([synthetic_groups()])
    assert stats[TRAINER_TOKEN_IMBALANCE] == 1.0
    assert MEMORY_TRAINER_PEAK_GB in stats
    assert {canonical_name(TRAINER_TOKEN_IMBALANCE), canonical_name(MEMORY_TRAINER_PEAK_GB)} == {
        "trainer/token_imbalance",
        "memory/trainer_peak_gb",
    }
