"""``trainer.pp_size=2`` end to end: ``test_tiny_learns``' GRPO run (real vLLM rollout, shm weight sync, the
digit-fraction reward) with the policy in two pipeline stages on two trainer ranks, on the default packed rows
(each group's prompt once), raises the reward as much as the one-rank run must."""

from __future__ import annotations

import pytest

from tests.controller.test_tiny_learns import REWARD_MEAN, _assert_rises, _run

PIPELINE = [
    "trainer.world_size=2",
    "trainer.pp_size=2",
    "trainer.num_threads=1",
]


@pytest.mark.slow
def test_grpo_tiny_in_two_pipeline_stages_raises_reward(ray_session, tiny_llama, tmp_path):
    rows = _run("grpo_tiny", PIPELINE, tiny_llama, tmp_path)
    _assert_rises("grpo pp=2", "reward", [r[REWARD_MEAN] for r in rows])
