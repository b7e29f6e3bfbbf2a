"""Which linears an engine may pack straight from the payload: ``commit.is_run`` by hand-worked layouts."""

from __future__ import annotations

import torch

from relayrl.weightsync.commit import is_run
from relayrl.weightsync.layout import FlatLayout


def _slots(*tensors: tuple[str, torch.dtype, tuple[int, int]]) -> dict:
    return {s.name: s for s in FlatLayout.plan(tensors, bucket_bytes=1 << 20).slots}


def test_adjacent_q_k_v_stack_into_qkv():
    # q [8, 4] fp32 = 128 B at 0, k [4, 4] = 64 B at 128, v [4, 4] = 64 B at 192 (64 B slots: no gaps)
    s = _slots(("q", torch.float32, (8, 4)), ("k", torch.float32, (4, 4)), ("v", torch.float32, (4, 4)))
    assert is_run([s["q"], s["k"], s["v"]], (16, 4), torch.float32)
    assert not is_run([s["q"], s["k"], s["v"]], (16, 4), torch.bfloat16)  # payload dtype != engine's
    assert not is_run([s["q"], s["v"], s["k"]], (16, 4), torch.float32)  # v before k: not the fused order
    assert not is_run([s["q"], s["k"]], (16, 4), torch.float32)  # stacks to [12, 4]


def test_a_gap_or_a_missing_tensor_is_not_a_run():
    # a [3, 4] fp32 = 48 B, its slot padded to 64 B: b starts at 64, 16 B after a ends
    s = _slots(("a", torch.float32, (3, 4)), ("b", torch.float32, (3, 4)))
    assert not is_run([s["a"], s["b"]], (6, 4), torch.float32)
    assert is_run([s["a"]], (3, 4), torch.float32)  # one tensor is always one run
    assert not is_run([s["a"], None], (6, 4), torch.float32)
    assert not is_run([], (0, 0), torch.float32)
