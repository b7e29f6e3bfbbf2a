"""bench/floor.py's formulas, by hand-worked numbers (the box's rates are given, not measured)."""

from __future__ import annotations

import pytest
import torch

from bench.floor import Box, Work, decode_steps, floors, gaps, gemm_weights, generate_floor_s, update_flops

# P = 100, P_emb = 20, 10 prompt tokens once, 30 completion tokens, 4 decode steps, 400 weight bytes
WORK = Work(params=100, embed_params=20, weight_bytes=400, prompt_tokens=10, completion_tokens=30, decode_steps=4)
BOX = Box(flops=1000.0, copy_bps=100.0)


def test_update_counts_the_lm_head_only_where_a_token_is_scored():
    # 6 * (100 - 20) * (10 + 30) + 6 * 20 * 30 = 19200 + 3600
    assert update_flops(WORK) == 22800


def test_generate_is_the_slower_of_weight_reads_and_decode_flops_plus_prefill():
    # reads 4 * 400 / 100 = 16 s; decode FLOPs 2 * 100 * 30 / 1000 = 6 s; prefill 2 * 100 * 10 / 1000 = 2 s
    assert generate_floor_s(WORK, BOX) == pytest.approx(18.0)
    fast_memory = Box(flops=1000.0, copy_bps=1e6)  # reads 0.0016 s: the FLOPs bound wins
    assert generate_floor_s(WORK, fast_memory) == pytest.approx(6.0 + 2.0)


def test_step_floor_is_the_sum_of_its_phases_and_gaps_divide():
    f = floors(WORK, BOX)
    # update 22800 / 1000 = 22.8; generate 18; sync 400 / 100 = 4
    assert f == pytest.approx({"update": 22.8, "generate": 18.0, "sync": 4.0, "step": 44.8})
    assert gaps({"update": 45.6, "sync": 4.0, "other": 1.0}, f) == pytest.approx({"update": 2.0, "sync": 1.0})


def test_decode_steps_are_max_tokens_once_a_completion_was_cut():
    assert decode_steps(32, 18.4, 0.34) == 32.0
    assert decode_steps(32, 18.4, 0.0) == 18.4


def test_sync_floor_adds_the_engines_pack_to_one_copy():
    # 400 / 100 = 4 s of copy, then 1.5 s to pack every GEMM weight once
    assert floors(WORK, Box(flops=1000.0, copy_bps=100.0, pack_s=1.5))["sync"] == pytest.approx(5.5)


def test_gemm_weights_are_fused_as_vllm_fuses_them_with_the_tied_head_last():
    sd = {"model.embed_tokens.weight": torch.full((10, 3), 9.0)}
    for i, (name, rows) in enumerate(
        [
            ("self_attn.q_proj", 4),
            ("self_attn.k_proj", 2),
            ("self_attn.v_proj", 2),
            ("self_attn.o_proj", 3),
            ("mlp.gate_proj", 5),
            ("mlp.up_proj", 5),
        ]
    ):
        sd[f"model.layers.0.{name}.weight"] = torch.full((rows, 3), float(i))
    sd["model.layers.0.mlp.down_proj.weight"] = torch.full((3, 5), 6.0)
    sd["model.layers.0.input_layernorm.weight"] = torch.ones(3)  # not a GEMM weight
    out = gemm_weights(sd)
    by_shape = {tuple(w.shape): w for w in out[:-1]}
    assert len(out) == 5 and set(by_shape) == {(8, 3), (10, 3), (3, 3), (3, 5)}
    assert by_shape[(8, 3)][:, 0].tolist() == [0.0] * 4 + [1.0] * 2 + [2.0] * 2  # q, then k, then v
    assert by_shape[(10, 3)][:, 0].tolist() == [4.0] * 5 + [5.0] * 5  # gate, then up
    assert out[-1] is sd["model.embed_tokens.weight"]
