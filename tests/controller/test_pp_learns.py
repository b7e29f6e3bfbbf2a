"""Pipelines on both sides end to end: ``test_tiny_learns``' GRPO run (real vLLM rollout, shm weight sync, the
digit-fraction reward) with the policy in two pipeline stages on two trainer ranks, on the default packed rows
(each group's prompt once), syncing into a vLLM engine split in two pipeline stages (``rollout.pp_size=2``). The
reward rises as much as the one-rank run's must, and the post-sync probe finds the engine scoring like the trainer
after every step's sync."""

from __future__ import annotations

import pytest

from tests.controller.test_tiny_learns import REWARD_MEAN, _assert_rises, _run

PIPELINE = [
    "trainer.world_size=2",
    "trainer.pp_size=2",
    "trainer.num_threads=1",
    "rollout.pp_size=2",
    "rollout.enforce_eager=false",  # vLLM's CPU pipeline needs a compiled engine
    "weightsync.verify_every=1",
]


@pytest.mark.slow
def test_grpo_tiny_in_two_pipeline_stages_raises_reward(ray_session, tiny_llama, tmp_path):
    rows = _run("grpo_tiny", PIPELINE, tiny_llama, tmp_path)
    _assert_rises("grpo pp=2", "reward", [r[REWARD_MEAN] for r in rows])
    probed = [r["mismatch/max_abs"] for r in rows if "mismatch/max_abs" in r]
    assert len(probed) == len(rows) and max(probed) < 1e-3, probed
