"""Flat layout: offsets, buckets and byte-exact packing, worked by hand."""

from __future__ import annotations

import pytest
import torch

from relayrl.weightsync.layout import ALIGN, Bucket, FlatLayout, bucket_views, pack

METAS = [("a", torch.float32, (3,)), ("b", torch.bfloat16, (2, 5)), ("c", torch.float32, (40,))]


def test_offsets_are_aligned_and_sizes_exact():
    layout = FlatLayout.plan(METAS, bucket_bytes=1 << 20)
    # a: 12 bytes at 0; b: 20 bytes at 64; c: 160 bytes at 128; total 128 + 192 (160 rounded up to 64s)
    assert [(s.offset, s.nbytes) for s in layout.slots] == [(0, 12), (64, 20), (128, 160)]
    assert layout.nbytes == 320 and all(s.offset % ALIGN == 0 for s in layout.slots)
    assert layout.buckets == (Bucket(0, 3, 0, 288),)


def test_buckets_cut_at_the_budget_and_a_big_tensor_gets_its_own():
    layout = FlatLayout.plan(METAS, bucket_bytes=100)
    # a+b span bytes 0..84 (<= 100); adding c would span 0..288 -> new bucket; c alone is 160 > 100
    assert layout.buckets == (Bucket(0, 2, 0, 84), Bucket(2, 3, 128, 288))
    assert FlatLayout.plan(METAS, bucket_bytes=1).buckets == (
        Bucket(0, 1, 0, 12),
        Bucket(1, 2, 64, 84),
        Bucket(2, 3, 128, 288),
    )


@pytest.mark.parametrize("bucket_bytes", [1, 100, 1 << 20])
def test_pack_then_views_round_trips_bit_exact(bucket_bytes):
    g = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(shape, generator=g).to(dtype) for n, dtype, shape in METAS}
    layout = FlatLayout.plan(METAS, bucket_bytes)
    flat = torch.zeros(layout.nbytes, dtype=torch.uint8)
    named = iter(tensors.items())
    for b in layout.buckets:  # bucket-sized buffers, copied into place, as the broadcast receiver sees them
        buf = torch.zeros(b.end - b.start, dtype=torch.uint8)
        pack(layout, b, named, bucket_views(layout, b, buf, base=b.start))
        flat[b.start : b.end] = buf
    got = dict(layout.views(flat))
    assert list(got) == ["a", "b", "c"]
    for n, t in tensors.items():
        assert got[n].dtype == t.dtype and torch.equal(got[n].view(torch.uint8), t.view(torch.uint8))


def test_pack_casts_to_the_wire_dtype():
    layout = FlatLayout.plan([("w", torch.bfloat16, (4,))], 1 << 20)
    flat = torch.zeros(layout.nbytes, dtype=torch.uint8)
    w = torch.tensor([1.0, 1 / 3, -2.5, 1e-3])
    pack(layout, layout.buckets[0], iter([("w", w)]), bucket_views(layout, layout.buckets[0], flat, base=0))
    assert torch.equal(dict(layout.views(flat))["w"], w.to(torch.bfloat16))


def test_pack_refuses_a_source_that_drifted_from_the_plan():
    layout = FlatLayout.plan(METAS, 1 << 20)
    flat = torch.zeros(layout.nbytes, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"weight 0 is 'x' .* planned 'a'"):
        pack(layout, layout.buckets[0], iter([("x", torch.zeros(3))]), bucket_views(layout, layout.buckets[0], flat, 0))


def test_dict_round_trip_and_digest_tracks_the_layout():
    layout = FlatLayout.plan(METAS, 100)
    assert FlatLayout.from_dict(layout.to_dict()) == layout
    assert FlatLayout.from_dict(layout.to_dict()).digest == layout.digest
    assert FlatLayout.plan(METAS, 1 << 20).digest != layout.digest
    with pytest.raises(ValueError, match="bucket_mb"):
        FlatLayout.plan(METAS, 0)
