"""The README's main job learns: grpo_arith (SmolLM2-135M, CPU) raises the mean reward by >= 0.15 within 15 of
its 25 steps (the whole run is `make train`; one run here went 0.34 -> 0.78 over its first 15 steps)."""

from __future__ import annotations

import pytest

from relayrl.config import load_config
from relayrl.controller import train


@pytest.mark.slow
def test_grpo_arith_raises_reward(ray_session, tmp_path):
    cfg = load_config("grpo_arith", [f"run.output_dir={tmp_path}", "logging.wandb=disabled", "run.steps=15"])
    result = train(cfg)
    first, last = result.window_means(5)
    print(f"grpo_arith: first-5 mean reward {first:.3f}, last-5 {last:.3f}")
    assert last - first >= 0.15
