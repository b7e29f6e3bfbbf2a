"""The PTD-P training-time and memory model (``plan/ptdp.py``) on hand-worked cases, and its check against
Narayanan et al. 2021 (``plan/megatron_paper.py``). Pure arithmetic: no Ray, no torch."""

from __future__ import annotations

import pytest

from relayrl.cli import main
from relayrl.plan.costs import Hardware
from relayrl.plan.megatron_paper import WEAK_SCALING, interleaved_gain, weak_scaling
from relayrl.plan.ptdp import (
    GPT,
    PTDP,
    Efficiency,
    bubble_fraction,
    bubble_gain,
    fit_gemm,
    in_flight,
    iteration_s,
    layouts,
    rank,
    ring_allreduce_s,
    stage_memory,
    tflops_per_gpu,
)

TINY = GPT(layers=4, hidden=8, heads=2, seq=4, vocab=16)
ROUND = Hardware("round", peak_flops=1e12, hbm_bytes_per_s=1e12, nvlink_bytes_per_s=1e11, ib_bytes_per_s=1e10)
UNIT = Efficiency(gemm=1.0, hbm=1.0, nvlink=1.0, ib=1.0, replicated=1.0, split=2.0, score=1.0, grad_bytes=2.0)


def test_params_and_flops_are_the_papers_equations():
    """l 2, h 4, V 8, s 4: 12 l h² = 384, 13 l h = 104, h (V + s) = 48: 536 parameters. FLOPs of one sequence:
    4 passes of the layers (24 s h² l + 4 s² h l = 3072 + 512) and 3 of the head (2 s h V = 256): 15104."""
    g = GPT(layers=2, hidden=4, heads=1, seq=4, vocab=8)
    assert g.params == pytest.approx(536)
    assert g.iteration_flops(1) == pytest.approx(4 * (3072 + 512) + 3 * 256)
    assert g.iteration_flops(3) == pytest.approx(3 * 15104)


def test_the_bubble_of_each_schedule():
    """p 4, m 8: (p − 1) / m = 3/8 for GPipe and 1F1B; interleaved with v 2 halves it; the gain is 1.375 / 1.1875;
    zero bubble leaves a third: 3/24, and 3/48 with v 2."""
    assert bubble_fraction(4, 8) == bubble_fraction(4, 8, 1, "gpipe") == pytest.approx(0.375)
    assert bubble_fraction(4, 8, 2, "interleaved") == pytest.approx(0.1875)
    assert bubble_fraction(4, 8, 1, "zero_bubble") == pytest.approx(0.125)
    assert bubble_fraction(4, 8, 2, "zero_bubble") == pytest.approx(0.0625)
    assert bubble_fraction(1, 8) == 0.0
    assert bubble_gain(4, 8, 2) == pytest.approx(1.375 / 1.1875)
    with pytest.raises(ValueError, match="zerobubble"):
        bubble_fraction(4, 8, 1, "zerobubble")


def test_a_ring_all_reduce_moves_twice_the_bytes_less_one_share():
    assert ring_allreduce_s(1e9, 4, 1e9) == pytest.approx(1.5)
    assert ring_allreduce_s(1e9, 1, 1e9) == 0.0


def test_an_iteration_by_hand():
    """TINY (l 4, h 8, a 2, s 4, V 16) at t 2, p 2, d 2, B 8, b 1: m = 4 micro-batches, 2 layers a stage.
    A layer, one micro-batch: GEMMs 96·4·64 / 2e12 = 12.288 ns; scores 16·16·8 / 2e12 = 1.024 ns; memory
    4·4·(8 + 2·8/2 + 2·4/2 = 20 bytes) / 1e12 = 0.32 ns; TP 6 all-reduces of 64 bytes over 2 ranks at 1e11 =
    3.84 ns. Times 2 layers and 4 micro-batches: 98.304, 8.192, 2.56, 30.72 ns. Head 6·4·8·16 / 2e12 = 1.536 ns,
    x 4 = 6.144; p2p 2·2·4·8 / 2 / 1e10 = 6.4 ns, x 4 = 25.6. Busy 171.52 ns, bubble (1/4) 42.88 ns. DP: 3648
    parameters, 2 bytes each over t·p = 4 devices is 1824 bytes, all-reduced over 2 at 1e10: 182.4 ns."""
    parts = iteration_s(ROUND, TINY, PTDP(2, 2, 2, 8), UNIT)
    expected = {"gemm": 98.304, "scores": 8.192, "memory": 2.56, "tp": 30.72, "head": 6.144, "p2p": 25.6}
    expected |= {"bubble": 42.88, "dp": 182.4, "total": 396.8}
    assert {k: v * 1e9 for k, v in parts.items()} == pytest.approx(expected)
    assert TINY.params == pytest.approx(3648)
    flops = TINY.iteration_flops(8)  # 96·8·4·4·64 · (1 + 4/48 + 16/512) = 876544
    assert flops == pytest.approx(876544)
    assert tflops_per_gpu(ROUND, TINY, PTDP(2, 2, 2, 8), UNIT) == pytest.approx(876544 / 396.8e-9 / 8 / 1e12)


def test_interleaving_moves_more_p2p_and_leaves_less_bubble():
    plain = iteration_s(ROUND, TINY, PTDP(2, 2, 2, 8), UNIT)
    inter = iteration_s(ROUND, TINY, PTDP(2, 2, 2, 8, 1, 2, "interleaved"), UNIT)
    assert inter["p2p"] == pytest.approx(2 * plain["p2p"])
    assert inter["bubble"] / (inter["total"] - inter["bubble"] - inter["dp"]) == pytest.approx(0.125)


def test_fit_gemm_recovers_the_efficiency_that_made_a_figure():
    lay = PTDP(2, 2, 2, 8)
    made = tflops_per_gpu(ROUND, TINY, lay, Efficiency(gemm=0.55))
    assert fit_gemm(ROUND, TINY, lay, made) == pytest.approx(0.55, rel=1e-6)
    with pytest.raises(ValueError, match="out of reach"):
        fit_gemm(ROUND, TINY, lay, 1e6)


def test_activations_in_flight_per_schedule():
    """m 8, p 4: GPipe holds 8 micro-batches, 1F1B 4; interleaved v 2 warms up 2 (p − 1) + (v − 1) p = 10
    chunks and runs one: 11 chunks of half a stage, 5.5 stages. Zero bubble holds what 1F1B (or interleaved) does."""
    assert in_flight(PTDP(1, 4, 1, 8, schedule="gpipe")) == 8
    assert in_flight(PTDP(1, 4, 1, 8)) == 4
    assert in_flight(PTDP(1, 4, 1, 2)) == 2
    assert in_flight(PTDP(1, 4, 1, 8, 1, 2, "interleaved")) == pytest.approx(5.5)
    assert in_flight(PTDP(1, 4, 1, 8, 1, 1, "zero_bubble")) == 4
    assert in_flight(PTDP(1, 4, 1, 8, 1, 2, "zero_bubble")) == pytest.approx(5.5)


def test_stage_memory_by_hand():
    """TINY at t 2, p 2, d 2, B 8: 16 bytes x 3648 / 4 = 14592 of state. A full layer keeps s b h (10 + 24/t +
    5 a s / (h t)) = 32 x 24.5 = 784 bytes; recomputed, 2 in flight x 2 layers x 2 s b h (64) + one full layer =
    1040; kept, 2 x 2 x 784 = 3136."""
    assert stage_memory(TINY, PTDP(2, 2, 2, 8)) == pytest.approx({"state": 14592, "activations": 1040, "total": 15632})
    assert stage_memory(TINY, PTDP(2, 2, 2, 8), recompute=False)["activations"] == pytest.approx(3136)


def test_a_layout_that_does_not_divide_is_refused_by_name():
    with pytest.raises(ValueError, match="schedule='pipedream'"):
        PTDP(1, 2, 1, 8, schedule="pipedream")
    with pytest.raises(ValueError, match="needs schedule='interleaved'"):
        PTDP(1, 2, 1, 8, virtual=2)
    with pytest.raises(ValueError, match="micro-batches"):
        PTDP(1, 1, 3, 8)


def test_layouts_and_rank_keep_only_what_divides_and_fits():
    g = GPT(layers=8, hidden=64, heads=4, seq=16, vocab=128)
    all_layouts = list(layouts(g, gpus=16, batch=32))
    assert all_layouts and all(lay.gpus == 16 for lay in all_layouts)
    assert all(g.layers % (lay.p * lay.virtual) == 0 and g.heads % lay.t == 0 for lay in all_layouts)
    assert any(lay.schedule == "interleaved" for lay in all_layouts)
    small = Hardware("small", 1e12, 1e12, 1e11, 1e10, memory_bytes=1e6)
    ranked = rank(small, g, 16, 32, UNIT)
    assert ranked and all(gib * 2**30 <= 1e6 for _, _, gib in ranked)
    assert [tf for _, tf, _ in ranked] == sorted((tf for _, tf, _ in ranked), reverse=True)
    fits = rank(small, g, 16, 32, UNIT, top=len(all_layouts))
    assert len(fits) < len(all_layouts)  # 16 bytes x 409k parameters over t p < 16 devices is over 1 MB


def test_the_weak_scaling_rows_are_the_papers():
    """The paper's eq. (2) on each row's layers and hidden size gives its parameter count (a check of the
    transcription); GPUs = t p d with d whole; the 1T row is the abstract's 502 petaFLOP/s on 3072 GPUs."""
    for row in WEAK_SCALING:
        assert row.gpt.params / 1e9 == pytest.approx(row.billions, abs=0.06), row
        assert row.gpus % (row.t * row.p) == 0
    last = WEAK_SCALING[-1]
    assert last.tflops * last.gpus / 1e3 == pytest.approx(502, rel=0.01)


def test_the_model_predicts_every_weak_scaling_row_within_15_percent():
    """One constant (the GEMM efficiency) fitted on the 1.7B row; the nine others are predictions."""
    rows = weak_scaling()
    assert rows[0].fitted and rows[0].error < 1e-6
    assert 0.3 < rows[0].gemm < 1.0
    assert max(r.error for r in rows[1:]) < 0.15


def test_the_interleaved_gain_shrinks_as_the_batch_grows():
    gains = [r["gain"] for r in interleaved_gain()]
    assert all(g > 0 for g in gains) and gains == sorted(gains, reverse=True)


def test_the_interleaved_gain_stays_under_the_bubbles_ratio():
    """Figure 12's setting, p 12, v 4: interleaving shrinks the bubble from 11 / m to 11 / (4 m) and sends 4x the
    activations, so its gain is at most (1 + 11 / m) / (1 + 11 / (4 m)) - 1: 1.9167 / 1.2292 - 1 = 55.9 % at m 12."""
    for r in interleaved_gain():
        m = r["batch"]
        ceiling = (1 + 11 / m) / (1 + 11 / (4 * m)) - 1
        assert 0.8 * ceiling < r["gain"] < ceiling


def test_cli_train_layouts_ranks_the_trainer_gpus_layouts(capsys):
    """``relayrl simulate --train-layouts``: Llama-3-8B on the file's 8 trainer GPUs, 64 x G sequences of
    256 + 1024 tokens; every row is a layout of 8 GPUs, fastest first."""
    argv = [
        "simulate",
        "--cluster",
        "h100-2x8",
        "--train-layouts",
        "run.prompts_per_step=64",
        "rollout.max_tokens=1024",
    ]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "llama3-8b on 8 h100-sxm trainer GPUs" in lines[0] and "of 1280 tokens" in lines[0]
    rows = [line.split() for line in lines[2:]]
    assert rows and all(int(r[0]) * int(r[1]) * int(r[2]) == 8 for r in rows)
    assert [float(r[6]) for r in rows] == sorted((float(r[6]) for r in rows), reverse=True)


def test_cli_train_layouts_says_what_to_change_when_nothing_fits(capsys):
    assert main(["simulate", "--cluster", "h100-2x8", "--train-layouts", "rollout.max_tokens=4000000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("no layout fits in memory") and "rollout.max_tokens" in lines[1]
