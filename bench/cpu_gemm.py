"""vLLM's CPU linears: pack the weights once per sync, or multiply by them unpacked? Side by side, one run.

vLLM's CPU engine multiplies by a oneDNN copy of each linear's weight in a blocked layout, which a sync must
rebuild (``weightsync.commit``: ``pack_direct``); that pack is most of a sync's commit. The alternative is to
multiply by the weight as it lies (``F.linear``), which would let an engine read its weights straight from the
sync payload and skip the pack. This bench prices both on the default model's own GEMM shapes (q/k/v and
gate/up fused as vLLM fuses them, o, down, the tied LM head; random weights of the engine's dtype):

    pack      ``floor.pack_floor_s``: build every oneDNN handle once, as a sync does (best of 3)
    decode    one decode step's GEMMs at batch M, packed (``onednn_mm``) and unpacked (``F.linear``);
              median of --reps calls per shape, summed over the model's layers
    verdict   extra seconds per generate call if unpacked (decode steps = --decode-steps, grpo_arith's
              rollout.max_tokens) against the pack seconds one sync costs

Usage::

    .venv/bin/python -m bench.cpu_gemm [--model smollm2] [--batch 8 32] [--decode-steps 32] [--reps 50]
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections import Counter

import torch

from bench.common import timings
from bench.floor import engine_weights, gemm_weights, meta_model, pack_floor_s


def median_ms(fn, reps: int) -> float:
    return statistics.median(timings(fn, reps, warmup=3)) * 1e3


def decode_ms(weights: list[torch.Tensor], m: int, reps: int) -> tuple[float, float]:
    """One decode step's GEMMs at batch ``m``: (packed, unpacked) milliseconds, each shape timed once and
    counted as often as the model has it."""
    from vllm import _custom_ops as ops

    counts = Counter(tuple(w.shape) for w in weights)
    packed = unpacked = 0.0
    for (n, k), count in counts.items():
        w, x = torch.randn(n, k, dtype=weights[0].dtype), torch.randn(m, k, dtype=weights[0].dtype)
        handle = ops.create_onednn_mm(w.t(), 32)
        packed += count * median_ms(functools.partial(ops.onednn_mm, handle, x, None), reps)
        unpacked += count * median_ms(functools.partial(torch.nn.functional.linear, x, w), reps)
    return packed, unpacked


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="model.path whose shapes are used")
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32], help="decode batch sizes M")
    ap.add_argument("--decode-steps", type=int, default=32, help="decode steps per generate call")
    ap.add_argument("--reps", type=int, default=50, help="timed calls per shape")
    args = ap.parse_args()

    cfg = {"model": {"path": args.model}}
    sd = engine_weights(meta_model(cfg), cfg)
    weights = gemm_weights(sd)
    pack_s = pack_floor_s(sd)
    print(
        f"{args.model}: {len(weights)} GEMM weights, {sum(w.numel() for w in weights) * 4 / 1e6:.0f} MB fp32, "
        f"{torch.get_num_threads()} torch threads; pack once (a sync's commit): {pack_s * 1e3:.0f} ms"
    )
    print(
        f"{'M':>4} {'packed ms/step':>15} {'unpacked ms/step':>17} {'unpacked/packed':>16} "
        f"{'extra s per generate':>21} {'extra / pack':>13}"
    )
    for m in args.batch:
        packed, unpacked = decode_ms(weights, m, args.reps)
        extra_s = (unpacked - packed) * args.decode_steps / 1e3
        print(
            f"{m:>4} {packed:>15.2f} {unpacked:>17.2f} {unpacked / packed:>15.2f}x {extra_s:>21.3f} "
            f"{extra_s / pack_s:>12.1f}x"
        )
    print(
        f"(extra s per generate: {args.decode_steps} decode steps; a sync packs once per generate call in a "
        "sync run, so 'extra / pack' > 1 means packing is the cheaper side)"
    )


if __name__ == "__main__":
    main()
