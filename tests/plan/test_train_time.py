"""An RL step's training time from the trainer's layout (``relayrl/plan/train_time.py``), worked by hand on round
hardware, and how ``relayrl simulate`` uses it (or says why it falls back to the assumed MFU)."""

from __future__ import annotations

import dataclasses

import pytest

from relayrl.plan.costs import Hardware, Workload
from relayrl.plan.ptdp import GPT, PTDP, Efficiency, layouts
from relayrl.plan.scenario import report_lines, scenario
from relayrl.plan.specs import cluster_spec
from relayrl.plan.train_time import layout_training, train_seconds
from tests.plan.test_scenario import ROUND_RECIPE, recipe, round_spec

# F = 1e15 FLOP/s, HBM 1e12 B/s, IB 1e11 B/s. Efficiency: GEMMs at 50 %, HBM and IB at 100 %, 20 · h bytes a token
# replicated and 10 · h split, no score bytes (FlashAttention). GPT: l 2, h 1000, a 10, s 1000, V 10000.
HW = Hardware(peak_flops=1e15, hbm_bytes_per_s=1e12, ib_bytes_per_s=1e11, memory_bytes=80e9)
EFF = Efficiency(gemm=0.5, hbm=1.0, ib=1.0, replicated=20.0, split=10.0, score=0.0)
SMALL = GPT(2, 1000, 10, 1000, 10000)
# One layer, one micro-batch (b = 1, t = 1): GEMMs 96 · 1000 · 1000² / 5e14 = 1.92e-4 s, scores 16 · 1000² · 1000 /
# 5e14 = 3.2e-5 s, memory 4 · 1000 · (20 + 10) · 1000 / 1e12 = 1.2e-4 s; the head 6 · 1000 · 1000 · 10000 / 5e14
# = 1.2e-4 s. B = 2 on d = 1, p = 1: m = 2, so the iteration is 4 layer-passes and 2 heads:
# 4 · (1.92e-4 + 3.2e-5 + 1.2e-4) + 2 · 1.2e-4 = 1.376e-3 + 2.4e-4 = 1.616e-3 s.
# One forward pass: 1.376e-3 / 4 + 2.4e-4 / 3 = 3.44e-4 + 8e-5 = 4.24e-4 s; the recomputation 3.44e-4 s.


def test_extra_forward_passes_add_a_forward_and_no_checkpointing_drops_the_recompute():
    lay = PTDP(1, 1, 1, 2)
    assert train_seconds(HW, SMALL, lay, EFF, 0) == pytest.approx(1.616e-3)
    assert train_seconds(HW, SMALL, lay, EFF, 1) == pytest.approx(1.616e-3 + 4.24e-4)  # 2.04e-3
    # two extra forwards, no recomputation: 1.616e-3 + 2 · 4.24e-4 − 3.44e-4 = 2.12e-3
    assert train_seconds(HW, SMALL, lay, EFF, 2, checkpointing=False) == pytest.approx(2.12e-3)


def test_the_bubble_keeps_its_fraction_and_the_gradient_all_reduce_is_added_once():
    """p = 2 (one layer a stage), m = 2: busy = 2 · (1.92e-4 + 3.2e-5 + 1.2e-4) + 2 · 1.2e-4 (head) + 2 · p2p
    (2 · 2 · 1000 · 1000 / 1e11 = 4e-5) = 6.88e-4 + 2.4e-4 + 8e-5 = 1.008e-3; bubble (p − 1) / m = 1/2. One extra
    forward: 6.88e-4 / 4 + 2.4e-4 / 3 + 8e-5 / 2 = 2.92e-4, so (1.008e-3 + 2.92e-4) · 1.5 = 1.95e-3 s.
    d = 2 (B = 4, m = 2 each): the p = 1 iteration plus one all-reduce of 2 bytes a parameter, 2 · 1/2 · 2 ·
    params / 1e11, params = 12 · 2 · 1e6 · (1 + 13 / 12000 + 11000 / 24000) = 3.50260e7: 7.0052e-4 s."""
    assert train_seconds(HW, SMALL, PTDP(1, 2, 1, 2), EFF, 1) == pytest.approx(1.95e-3)
    params = 12 * 2 * 1e6 * (1 + 13 / 12000 + 11000 / 24000)
    assert train_seconds(HW, SMALL, PTDP(1, 1, 2, 4), EFF, 1) == pytest.approx(2.04e-3 + 2 * params / 1e11)


def test_padded_layouts_round_the_batch_up_to_whole_micro_batches():
    """3 sequences on d = 2: no layout divides them; padded, b = 1 runs 2 micro-batches a replica (batch 4) and
    b = 2 one (batch 4)."""
    assert not [lay for lay in layouts(SMALL, 2, 3, gpus_per_node=1, micro=(1, 2)) if lay.d == 2]
    padded = [lay for lay in layouts(SMALL, 2, 3, gpus_per_node=1, micro=(1, 2), pad=True) if lay.p == 1]
    assert [(lay.d, lay.micro, lay.batch, lay.micro_batches) for lay in padded] == [(2, 1, 4, 2), (2, 2, 4, 1)]


# The RL step: B = 1 prompt of 200 tokens, G = 2 completions of 800: 2 sequences of 1000 tokens (SMALL's), T = 200 +
# 2 · 800 = 1800 trained tokens, one extra forward; P = 4.4e7: the layers' 12 · 2 · 1000² = 2.4e7 and an untied
# embedding and head of 10000 · 1000 each, so the GPT's GEMMs are the model's (scale 1). With RL_EFFICIENCY (GEMMs
# 0.7, HBM 0.8, 22 · h and 16 · h bytes, no score bytes) on one GPU (b = 1 and b = 2 tie; the first, b = 1, is taken):
# GEMM-bound terms (4 · (1.92e-4 + 3.2e-5) + 2 · 1.2e-4) · 0.5 / 0.7 = 1.136e-3 · 5/7 = 8.1143e-4 s; memory 4 ·
# 4 · 1000 · 38000 / 8e11 = 7.6e-4 s; iteration 1.57143e-3 s. Forward: (8.96e-4 · 5/7 + 7.6e-4) / 4 + 2.4e-4 ·
# 5/7 / 3 = 3.5e-4 + 5.714e-5 = 4.0714e-4 s. Step: 1.97857e-3 s; MFU 8 · 4.4e7 · 1800 / (1e15 · 1.97857e-3) = 0.32023.
STEP = Workload(4.4e7, 200, 800, 1, 2, layers=2, hidden=1000, heads=10, vocab=10000, extra_forwards=1)


def test_the_step_takes_the_fastest_fitting_layout_and_its_mfu_is_an_output():
    training, why = layout_training(HW, STEP, 1, gpus_per_node=1)
    assert why == "" and training is not None
    assert (training.gpt.seq, training.layout) == (1000, PTDP(1, 1, 1, 2, 1))
    assert training.seconds(HW, STEP) == pytest.approx(1.57143e-3 + 4.0714e-4, rel=1e-4)
    assert training.mfu(HW, STEP) == pytest.approx(0.32023, rel=1e-3)
    # tied embeddings and P = 4.6e7: layers (4.6e7 − 1e7) / 2.4e7 = 1.5 times the GPT's, so the GEMMs (4 · 1.92e-4 ·
    # 5/7 = 5.4857e-4 s) grow by half, 2.7429e-4 s, in the iteration and a quarter of that in the extra forward
    wide = dataclasses.replace(STEP, params=4.6e7, tied_embeddings=True)
    assert training.seconds(HW, wide) == pytest.approx(1.97857e-3 + 1.25 * 2.7429e-4, rel=1e-4)


def test_without_the_models_shape_or_memory_the_step_keeps_the_assumed_mfu():
    no_heads = Workload(3.5e7, 200, 800, 1, 2, layers=2, hidden=1000)
    assert layout_training(HW, no_heads, 1) == (None, "the model's layers, hidden size or heads are not given")
    tiny = Hardware(peak_flops=1e15, memory_bytes=1e6)  # 16 bytes a parameter alone need 704 MB
    assert layout_training(tiny, STEP, 1, gpus_per_node=1) == (None, "no t/p/d layout of 1 trainer GPUs fits a device")


def test_simulate_prices_training_by_the_layout_and_says_which():
    """The round model has no head_dim: the assumed MFU, and the report says so. Llama-3-8B on the default
    cluster (4 trainer GPUs): derived, printed with its MFU. A recipe naming trainer.tp_size=2 gets t 2, d 2."""
    sc = scenario(recipe(*ROUND_RECIPE), round_spec())
    assert sc.costs.training is None
    text = "\n".join(report_lines(sc, sc.run(2)))
    assert "train: MFU 50% assumed (the model's layers, hidden size or heads are not given: costs.train_s)" in text
    llama = scenario(recipe(), cluster_spec({}))
    assert llama.costs.training is not None and not llama.costs.training.named
    line = next(x for x in report_lines(llama, llama.run(2)) if x.startswith("train:"))
    assert "(the fastest that fits)" in line and "derived" in line
    named = scenario(recipe("trainer.tp_size=2", "trainer.world_size=2"), cluster_spec({})).costs.training
    assert named is not None and named.named and (named.layout.t, named.layout.p, named.layout.d) == (2, 1, 2)
