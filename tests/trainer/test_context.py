"""Context parallelism: a packed row split over 2 gloo ranks trains exactly what one rank trains.

The index math by hand (``context.shard_row``), then real Ray + gloo: world_size 2 with cp_size 2 against
world_size 1, the same three steps of ``test_tp`` (KL against a reference that runs split too, shared
prompts whose branches straddle the split), stats, grad norms and gathered weights equal (fp32)."""

from __future__ import annotations

import re

import pytest
import torch

from relayrl.trainer import context
from relayrl.trainer.packing import pack_rows
from tests.trainer.test_tp import _assert_same_run, train


def _group(rank: int, size: int = 2) -> context.Group:
    return context.Group(group=None, rank=rank, size=size)  # type: ignore[arg-type]  # index math only


def test_shard_row_by_hand():
    """5 tokens over 2 ranks: padded to 6 (one pad token, a segment of its own), 3 each; the entries at
    positions 0, 1 (rank 0) and 3 (rank 1); each rank scores 2 positions (rank 1 pads one at local 0)."""
    seqs = [[5, 6, 7], [8, 9]]
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    row = pack_rows(seqs, [[0], [1]], mask, target_start=0, share_prefix=False)
    assert row.score_pos.tolist() == [0, 1, 3]
    zero, one = context.shard_row(row, _group(0)), context.shard_row(row, _group(1))
    assert zero.row.input_ids.tolist() == [[5, 6, 7, 8, 9, 0]]
    assert zero.row.segment.tolist() == [0, 0, 0, 1, 1, 2]
    assert zero.row.position_ids.tolist() == [[0, 1, 2, 0, 1, 0]]
    assert (zero.attn.start, zero.attn.end, one.attn.start, one.attn.end) == (0, 3, 3, 6)
    assert one.input_ids.tolist() == [[8, 9, 0]] and one.position_ids.tolist() == [[0, 1, 0]]
    assert zero.counts == one.counts == (2, 1)
    assert zero.score_pos.tolist() == [0, 1] and zero.score_target.tolist() == [6, 7]
    assert one.score_pos.tolist() == [0, 0] and one.score_target.tolist() == [9, 0]
    assert zero.order.tolist() == [0, 1, 2]


def test_entries_come_back_in_entry_order():
    """Entries whose positions are not in rank order: the gathered values are put back by ``order``."""
    row = pack_rows([[5, 6, 7, 8]], [[0]], torch.ones(1, 3), target_start=0, share_prefix=False)
    row.score_pos = torch.tensor([2, 0, 1])  # a permuted entry list: ranks own entries {1, 2} and {0}
    row.score_target = torch.tensor([8, 6, 7])
    zero, one = context.shard_row(row, _group(0)), context.shard_row(row, _group(1))
    assert zero.counts == (2, 1) and zero.score_pos.tolist() == [0, 1] and one.score_pos.tolist() == [0, 0]
    gathered = torch.cat([torch.tensor([10.0, 11.0]), torch.tensor([12.0])])  # rank 0's, then rank 1's
    assert gathered[zero.order].tolist() == [12.0, 10.0, 11.0]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["trainer.world_size=3", "trainer.cp_size=2"], "trainer.world_size=3 is not divisible by trainer.cp_size=2"),
        (["trainer.world_size=4", "trainer.cp_size=2", "trainer.tp_size=2"], "set one of them to 1"),
        (
            ["trainer.world_size=2", "trainer.cp_size=2", "trainer.max_tokens_per_micro_batch=0"],
            "set trainer.max_tokens_per_micro_batch > 0",
        ),
        (["trainer.world_size=2", "trainer.cp_size=2", "algorithm.name=gae"], "set trainer.cp_size=1"),
        (["trainer.cp_size=0"], "trainer.cp_size=0 must be > 0"),
    ],
)
def test_bad_cp_config_is_one_line_before_ray(overrides, expected):
    from relayrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=re.escape(expected)) as info:
        load_config("grpo_tiny", overrides)
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def groups_refs(ray_session, tiny_llama):
    from tests.trainer.test_actor import _hf_model, _synthetic_groups

    groups = _synthetic_groups(vocab=_hf_model(tiny_llama).config.vocab_size)
    return [ray_session.put(groups[:2]), ray_session.put(groups[2:])]


def test_cp2_matches_one_rank(tiny_llama, groups_refs):
    reference = train(tiny_llama, 1, 1, 3, groups_refs)
    reference.pop("trainer").shutdown()
    split = train(tiny_llama, 2, 1, 3, groups_refs, cp_size=2)
    try:
        _assert_same_run(split, reference, "cp=2")
        assert abs(reference["stats"][-1]["loss"] - reference["stats"][0]["loss"]) > 1e-3  # training moved it
        assert split["stats"][0]["trainer/token_imbalance"] == 1.0  # one dp rank: the cp ranks share its rows
    finally:
        split["trainer"].shutdown()
