"""bench/floor.py's formulas, by hand-worked numbers (the box's rates are given, not measured)."""

from __future__ import annotations

import pytest

from bench.floor import Box, Work, decode_steps, floors, gaps, generate_floor_s, update_flops

# P = 100, P_emb = 20, 10 prompt tokens once, 30 completion tokens, 4 decode steps, 400 weight bytes
WORK = Work(params=100, embed_params=20, weight_bytes=400, prompt_tokens=10, completion_tokens=30, decode_steps=4)
BOX = Box(flops=1000.0, copy_bps=100.0)


def test_update_counts_the_lm_head_only_where_a_token_is_scored():
    # 6 * (100 - 20) * (10 + 30) + 6 * 20 * 30 = 19200 + 3600
    assert update_flops(WORK) == 22800


def test_generate_is_the_slower_of_weight_reads_and_decode_flops_plus_prefill():
    # reads 4 * 400 / 100 = 16 s; decode FLOPs 2 * 100 * 30 / 1000 = 6 s; prefill 2 * 100 * 10 / 1000 = 2 s
    assert generate_floor_s(WORK, BOX) == pytest.approx(18.0)
    fast_memory = Box(flops=1000.0, copy_bps=1e6)          # reads 0.0016 s: the FLOPs bound wins
    assert generate_floor_s(WORK, fast_memory) == pytest.approx(6.0 + 2.0)


def test_step_floor_is_the_sum_of_its_phases_and_gaps_divide():
    f = floors(WORK, BOX)
    # update 22800 / 1000 = 22.8; generate 18; sync 400 / 100 = 4
    assert f == pytest.approx({"update": 22.8, "generate": 18.0, "sync": 4.0, "step": 44.8})
    assert gaps({"update": 45.6, "sync": 4.0, "other": 1.0}, f) == pytest.approx({"update": 2.0, "sync": 1.0})


def test_decode_steps_are_max_tokens_once_a_completion_was_cut():
    assert decode_steps(32, 18.4, 0.34) == 32.0
    assert decode_steps(32, 18.4, 0.0) == 18.4
