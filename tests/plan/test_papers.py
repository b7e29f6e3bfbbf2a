"""The published rows and how one is simulated (``plan/papers.py``; the fit and the table are
``bench/sim_papers.py``'s, minutes of CPU)."""

from __future__ import annotations

import pytest

from relayrl.plan.costs import capped_lognormal_mean
from relayrl.plan.papers import (
    AREAL,
    LLAMARL,
    NEMO_RL,
    nemo_costs,
    response_for_mean,
    row_costs,
    simulate_row,
    tp_for,
)
from relayrl.plan.simulate import simulate
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


def test_a_sync_step_sends_every_group_at_once_when_the_replicas_do_not_divide_the_batch():
    """7B sync: 512 groups on 192 one-GPU servers. Chunks of B // replicas = 2 groups would need a second round
    of calls for the last 128; one group a call, 3 slots a replica, sends all 512 at the step's start."""
    pc, costs = row_costs(AREAL[1], 8000, 0.0, asynchronous=False)
    assert pc.replicas == 192 and pc.stream and pc.chunk == 1 and pc.slots == 3
    first = simulate(pc, costs, steps=1)
    starts = [s.start for s in first.spans if s.what == "generate"]
    assert len(starts) == 512 and max(starts) == 0.0


def test_a_simulated_row_is_faster_async_and_slower_with_longer_answers():
    short = simulate_row(AREAL[0], 4000, 0.0, steps=3)
    long = simulate_row(AREAL[0], 8000, 0.0, steps=3)
    assert short[1] < short[0] and long[1] < long[0]
    assert long[0] > short[0] and long[1] > short[1]


def test_nemo_rows_are_the_published_ones():
    """NeMo RL v0.5 H100 BF16: 8B 92.8 s on 16 GPUs, 64.8 s one step off (8 generating); 32B 376 s on 32, 200 s on
    64 (32 generating)."""
    assert [(r.sync_s, r.async_s, r.gpus, r.gen_gpus) for r in NEMO_RL] == [
        (92.8, 64.8, (16, 16), 8),
        (376.0, 200.0, (32, 64), 32),
    ]


@pytest.mark.parametrize("mean, cap", [(869.0, 3946), (3101.0, 3946), (500.0, 100000)])
def test_response_for_mean_inverts_the_capped_mean(mean, cap):
    """The measured mean is after the cap: the lognormal's own mean is above it, by more the closer the cap."""
    response = response_for_mean(mean, 0.6, cap)
    assert capped_lognormal_mean(response, 0.6, cap) == pytest.approx(mean, rel=1e-6)
    assert response >= mean


def test_nemo_layouts_follow_the_recipes():
    """8B one step off: 8 vLLM engines of 1 GPU, 8 training GPUs, k = 1. 32B on policy: 8 engines of TP 4
    colocated with training on all 32. Training: 2 extra forwards (previous and reference log-probabilities) and
    one more at 8B (activation recomputation)."""
    pc, costs = nemo_costs(NEMO_RL[0], 0.0, asynchronous=True)
    assert (costs.cluster.rollout_devices, costs.cluster.trainer_devices, pc.replicas) == (8, 8, 8)
    assert pc.max_staleness == 1 and pc.stream and costs.workload.extra_forwards == 3
    pc, costs = nemo_costs(NEMO_RL[1], 0.0, asynchronous=False)
    assert costs.cluster.placement == "colocated" and costs.cluster.rollout_devices == 32 and pc.replicas == 8
    assert costs.workload.extra_forwards == 2 and costs.workload.prompts_per_step * costs.workload.group_size == 2048
    assert costs.workload.prompt_len + costs.workload.mean_response == pytest.approx(3251, abs=1)


def test_the_papers_rows_keep_the_stated_mfu_unless_switched_to_the_layout(monkeypatch):
    """Both papers price training at 40 % MFU (``TRAIN_FROM_LAYOUT`` says why). Switched on, the 8B NeMo row
    takes the trainer's layout: 2 extra forwards, the recomputation counted by the layout model instead."""
    from relayrl.plan import papers

    _, costs = nemo_costs(NEMO_RL[0], 0.0, asynchronous=True)
    assert costs.training is None and costs.workload.extra_forwards == 3
    monkeypatch.setitem(papers.TRAIN_FROM_LAYOUT, "nemo", True)
    _, costs = nemo_costs(NEMO_RL[0], 0.0, asynchronous=True)
    assert costs.training is not None and costs.workload.extra_forwards == 2
    assert costs.workload.activation_checkpointing and costs.training.layout.gpus == 8
