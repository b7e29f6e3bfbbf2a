"""bench/startup_floor.py's bare trainer batch, by hand-worked numbers."""

from __future__ import annotations

import pytest

from bench.startup_floor import batch


def test_batch_pads_right_scores_completion_tokens_and_normalises_rewards_per_group():
    rows = [{"prompt_ids": [5, 6], "completion_ids": [[7], [8, 9]], "rewards": [1.0, 0.0]},
            {"prompt_ids": [4], "completion_ids": [[3, 2], [1]], "rewards": [0.5, 0.5]}]
    ids, mask, scored, adv = batch(rows)
    assert ids.tolist() == [[5, 6, 7, 0], [5, 6, 8, 9], [4, 3, 2, 0], [4, 1, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]
    # scored[i, j]: ids[i, j + 1] is a completion token (position j predicts it)
    assert scored.tolist() == [[0, 1, 0], [0, 1, 1], [1, 1, 0], [1, 0, 0]]
    # group 1: mean 0.5, std (unbiased) sqrt(0.5) -> +-0.7071; group 2 agrees: 0
    assert adv.tolist() == pytest.approx([0.5 / 0.5 ** 0.5, -0.5 / 0.5 ** 0.5, 0.0, 0.0], rel=1e-5)
