"""The LM head split by vocabulary over tp ranks (``relayrl/trainer/vocab_parallel.py``) against the whole head.

The shipped model's head shape (V x H from its config.json, random fp32 weights), K positions scored through the
chunked head (``head.score``, ``trainer.logits_chunk`` positions a chunk, the entropy with its gradient) forward
and backward, as the last stage's loss runs it. Each tp size t runs in t real processes over gloo, one thread a
rank, with the head split by rows (``Shard(0)``); t = 1 is the whole head on one rank. Per t it prints the slowest
rank's median seconds over the repeats, the head weight a rank keeps, and the ratio to the floor: the whole head's
time over t (a perfect split; what it leaves out is the all-reduces of a float a position). Usage::

    .venv/bin/python -m bench.vocab_parallel [--positions 2048] [--chunk 1024] [--tp 1 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from bench.common import load_note
from bench.long_context import model_path
from bench.ranks import spawn_ranks
from relayrl.trainer import head


def _worker(rank: int, tp: int, args: argparse.Namespace, shape: tuple[int, int], out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    vocab, hidden = shape
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(vocab, hidden, generator=g) * hidden**-0.5
    if tp > 1:
        weight = distribute_tensor(weight, init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",)), [Shard(0)])
    weight = torch.nn.Parameter(weight)
    states = torch.randn(1, args.positions, hidden, generator=g, requires_grad=True)
    targets = torch.randint(0, vocab, (1, args.positions), generator=g)
    request = head.Request(targets, 1.0, args.chunk, entropy_grad=True)
    seconds = []
    for _ in range(args.repeats + 1):  # the first is a warm-up
        dist.barrier()
        t0 = time.perf_counter()
        logprob, entropy = head.score(states, weight, None, request)
        (logprob.sum() + entropy.sum()).backward()
        seconds.append(time.perf_counter() - t0)
        weight.grad = states.grad = None
    local = weight.to_local() if hasattr(weight, "to_local") else weight
    kept = local.numel() * local.element_size()
    Path(f"{out}.{rank}").write_text(json.dumps({"s": statistics.median(seconds[1:]), "bytes": kept}))


def run(tp: int, args: argparse.Namespace, shape: tuple[int, int]) -> tuple[float, int]:
    """(the slowest rank's median seconds, the head bytes a rank keeps) for ``tp`` ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/result"
        spawn_ranks(_worker, tp, Path(tmp) / "store", tp, args, shape, out)
        results = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(tp)]
    return max(r["s"] for r in results), max(r["bytes"] for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.tp[0] != 1:
        ap.error("--tp must start with 1: the whole head is the floor's measure")
    config = json.loads((Path(model_path(False)) / "config.json").read_text())
    shape = (config["vocab_size"], config["hidden_size"])
    when = f"{datetime.datetime.now():%Y-%m-%d %H:%M}"
    print(f"{when}  head {shape[0]} x {shape[1]} fp32, {args.positions} positions, chunk {args.chunk}, forward + ")
    print(f"backward, one thread a rank  {load_note()}")
    print("| tp | s (slowest rank) | head MB a rank | floor s (whole / tp) | vs floor |")
    print("| --- | --- | --- | --- | --- |")
    whole = 0.0
    for tp in args.tp:
        seconds, kept = run(tp, args, shape)
        whole = whole or seconds  # tp = 1 comes first: the whole head
        floor = whole / tp
        print(f"| {tp} | {seconds:.3f} | {kept / 1e6:.1f} | {floor:.3f} | {seconds / floor:.2f} |")


if __name__ == "__main__":
    main()
