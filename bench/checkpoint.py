"""Checkpoint stall: synchronous DCP save vs asynchronous (``async_save``), side by side in one run.

What runs, in this process (a 1-rank gloo group, as a CPU trainer rank has): a randomly initialised
Llama of the given shapes with AdamW state (``trainer.checkpoint.init_optimizer_state``), saved by the
trainer's own ``Saver`` into a temporary directory, ``--saves`` times per mode, alternating modes.

* stall   seconds ``Saver.save`` held the caller: what training waits for (``timing/checkpoint_stall``).
          sync: the whole write; async: the staging copy into host memory.
* write   seconds from the call until the checkpoint is on disk (async: until the future is done,
          polled every 5 ms while the caller "trains", here an optimizer step on random gradients).

Models: ``tiny`` (the test model's shapes, ~0.4M params) and ``smollm2`` (SmolLM2-135M's shapes:
30 layers, d=576, tied embeddings; ~1.6 GB of fp32 weights + AdamW moments per checkpoint).

Usage::

    .venv/bin/python -m bench.checkpoint [--models tiny smollm2] [--saves 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from relayrl.trainer.checkpoint import Parts, Saver

SHAPES = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=True,
    ),
    "smollm2": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
}


def make_parts(kind: str) -> Parts:
    model = LlamaForCausalLM(LlamaConfig(**SHAPES[kind]))
    return {"policy": (model, torch.optim.AdamW(model.parameters(), lr=1e-5))}


def train_a_little(parts: Parts) -> None:
    """Stand-in for a training step between saves: random gradients, one AdamW step."""
    model, optim = parts["policy"]
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optim.step()
    optim.zero_grad(set_to_none=True)


def one_save(parts: Parts, saver: Saver, root: Path, asynchronous: bool) -> tuple[float, float]:
    """(stall, write) seconds of one save into a fresh directory under ``root``."""
    path = Path(tempfile.mkdtemp(dir=root))
    t0 = time.perf_counter()
    stall = saver.save(path, parts, rank=0, asynchronous=asynchronous)
    train_a_little(parts)  # training goes on while an async write runs
    while not saver.done():
        time.sleep(0.005)
    write = time.perf_counter() - t0
    shutil.rmtree(path)
    return stall, write


def bench(kind: str, saves: int, root: Path) -> None:
    parts, saver = make_parts(kind), Saver()
    n = sum(p.numel() for p in parts["policy"][0].parameters())
    one_save(parts, saver, root, asynchronous=False)  # warm-up: optimizer state, page cache
    runs: dict[str, list[tuple[float, float]]] = {"sync": [], "async": []}
    for _ in range(saves):
        for mode in ("sync", "async"):
            runs[mode].append(one_save(parts, saver, root, asynchronous=mode == "async"))
    stall = {m: statistics.median(s for s, _ in r) for m, r in runs.items()}
    write = {m: statistics.median(w for _, w in r) for m, r in runs.items()}
    print(f"\n{kind}: {n / 1e6:.1f}M params, {3 * 4 * n / 1e9:.2f} GB fp32 weights+AdamW, median of {saves}")
    for m in ("sync", "async"):
        print(f"  {m:5s}  stall {stall[m]:8.3f} s   on disk after {write[m]:8.3f} s")
    print(f"  stall sync/async = {stall['sync'] / max(stall['async'], 1e-9):.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=sorted(SHAPES))
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the checkpoints are written (default: /tmp)")
    args = parser.parse_args()
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    try:
        with tempfile.TemporaryDirectory(dir=args.dir) as root:
            for kind in args.models:
                bench(kind, args.saves, Path(root))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
