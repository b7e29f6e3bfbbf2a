"""The published rows and how one is simulated (``plan/papers.py``; the fit and the table are
``bench/sim_papers.py``'s, minutes of CPU)."""

from __future__ import annotations

import pytest

from relayrl.plan.papers import AREAL, LLAMARL, row_costs, simulate_row, tp_for
from relayrl.plan.specs import GPUS, MODELS


def test_areal_rows_are_the_papers_hours_per_step():
    """Table 1: 1.5B 41.0 h (sync) and 14.8 h (AReaL) over 250 steps; 32B 51.1 h and 31.1 h over 60."""
    assert (AREAL[0].sync_s, AREAL[0].async_s) == pytest.approx((590.4, 213.12))
    assert (AREAL[-1].sync_s, AREAL[-1].async_s) == pytest.approx((3066.0, 1866.0))
    assert [8 * r.nodes for r in AREAL] == [128, 192, 256, 384]
    assert LLAMARL["405b"][0] / LLAMARL["405b"][1] == pytest.approx(10.7, abs=0.05)  # the abstract's 10.7x


def test_generation_tp_is_the_fewest_gpus_holding_the_weights_and_one_groups_kv_cache():
    """BF16 weights in half of 80 GB: 1.5B (3 GB), 7B (15 GB) and 14B (30 GB) fit one GPU, 32B (66 GB) needs two.
    One group's KV at 16 x 14,400 tokens: 14B's 196,608 bytes a token (48 layers x 8 heads x 128 x 2 x 2) is
    45 GB, over one GPU's 72 - 30 GB: two GPUs."""
    h800 = GPUS["h800"].memory_bytes
    assert MODELS["qwen2.5-14b"].kv_bytes_per_token == 48 * 8 * 128 * 2 * 2
    assert [tp_for(MODELS[r.model], h800, 16 * 400) for r in AREAL] == [1, 1, 1, 2]
    assert [tp_for(MODELS[r.model], h800, 16 * 14400) for r in AREAL] == [1, 1, 2, 2]


def test_async_rows_split_the_gpus_75_25_in_whole_servers_and_sync_rows_colocate():
    pc, costs = row_costs(AREAL[-1], 8000, 0.0, asynchronous=True)  # 384 GPUs, servers of 2
    assert (costs.cluster.rollout_devices, costs.cluster.trainer_devices) == (288, 96)
    assert pc.replicas == 144 and pc.max_staleness == 4 and pc.stream
    pc, costs = row_costs(AREAL[0], 8000, 0.0, asynchronous=False)
    assert costs.cluster.placement == "colocated" and pc.max_staleness == 0 and pc.colocated


def test_a_simulated_row_is_faster_async_and_slower_with_longer_answers():
    short = simulate_row(AREAL[0], 4000, 0.0, steps=3)
    long = simulate_row(AREAL[0], 8000, 0.0, steps=3)
    assert short[1] < short[0] and long[1] < long[0]
    assert long[0] > short[0] and long[1] > short[1]
