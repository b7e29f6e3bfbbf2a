"""The trainer's warm-up step changes nothing the run trains: same weights, a fresh AdamW, the same RNG, and
the next real step equal to a run that never warmed up (in-process tiny Llama, one gloo rank)."""

from __future__ import annotations

import pytest
import torch

from relayrl.trainer.warmup import warmup_groups, zero_lr
from tests.trainer.test_packing import SHARED, local_actor, one_rank_group, synthetic_groups  # noqa: F401


def test_warmup_groups_have_the_asked_shape_and_a_reward_spread():
    groups = warmup_groups(groups=3, group_size=4, prompt_tokens=9, completion_tokens=6, vocab_size=50)
    assert [g.prompt_id for g in groups] == [0, 1, 2]
    for g in groups:
        assert [t.sample_idx for t in g.trajectories] == [0, 1, 2, 3]
        assert {len(t.prompt_token_ids) for t in g.trajectories} == {9}
        assert {len(t.completion_token_ids) for t in g.trajectories} == {6}
        assert len({tuple(t.prompt_token_ids) for t in g.trajectories}) == 1       # one prompt per group
        assert [t.reward for t in g.trajectories] == [0.0, 1.0, 0.0, 1.0]
        ids = [i for t in g.trajectories for i in t.prompt_token_ids + t.completion_token_ids]
        assert min(ids) >= 3 and max(ids) < 50


def test_zero_lr_restores_the_rates_even_on_error():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], lr=0.5)
    with pytest.raises(RuntimeError), zero_lr([opt]):
        assert opt.param_groups[0]["lr"] == 0.0
        raise RuntimeError("boom")
    assert opt.param_groups[0]["lr"] == 0.5


def _actor(tiny_llama):
    actor = local_actor(tiny_llama, **SHARED)
    actor.trained = {"policy": (actor.model, actor.optimizer)}
    return actor


def test_warm_up_leaves_weights_optimizer_and_rng_as_they_were(one_rank_group, tiny_llama, monkeypatch):  # noqa: F811
    warmed, plain = _actor(tiny_llama), _actor(tiny_llama)
    before = {k: v.clone() for k, v in warmed.model.state_dict().items()}
    seen = []
    real_step = type(warmed).train_step
    monkeypatch.setattr(type(warmed), "train_step", lambda self, refs: seen.append(refs[0]) or real_step(self, refs))
    torch.manual_seed(7)
    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    warmed.warm_up(3, 4, 9, 6)
    assert torch.equal(torch.get_rng_state(), rng)
    assert [len(g.trajectories) for g in seen[0]] == [4, 4, 4]                    # it did train a step
    assert all(torch.equal(before[k], v) for k, v in warmed.model.state_dict().items())
    assert not warmed.optimizer.state and warmed.optimizer.param_groups[0]["lr"] == 1e-3
    assert torch.get_num_threads() == threads                                    # its one thread handed back

    groups = synthetic_groups()
    stats_warmed, stats_plain = warmed.train_step([groups]), plain.train_step([groups])
    assert {k: v for k, v in stats_warmed.items() if not k.endswith("_seconds")} == \
        {k: v for k, v in stats_plain.items() if not k.endswith("_seconds")}
    after = plain.model.state_dict()
    moved = [k for k, v in warmed.model.state_dict().items() if not torch.equal(v, before[k])]
    assert moved and all(torch.equal(warmed.model.state_dict()[k], after[k]) for k in after)

