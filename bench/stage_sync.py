"""Weight sync from a pipelined trainer: each stage writing its own weights (``send_stages``) against rank 0 writing
them all after each is sent to it from the stage that holds it (the one-sender path ``broadcast`` takes), side by
side in one run, for ``shm`` (into the engines' shared buffer) and ``pull`` (into the store's draft, a checksum a
tensor, then published), each against its floor.

Two gloo ranks in real processes (one torch thread each), each holding only its pipeline stage of a model shaped
like SmolLM2-135M (fp32, real config, tied embedding once; stages cut by ``pp_weights.owners``), the other's
weights meta stand-ins as ``pp_weights.load_stages`` leaves them. Rank 0's client is a stand-in that opens the
engine side's real receiver (``ShmReceiver``, ``PullReceiver``) and, after the timed syncs, reads every tensor
back through it and checks it (no vLLM: the engines' commit is ``bench/weight_sync.py``'s and does not depend on
who wrote the bytes). The backends run with the product's defaults (``/dev/shm``; pull: a private store there).

Floors, measured in the same processes on the same bytes (copies only: pull's checksums and fsync come on top):
- rank 0 path: one single-thread memcpy of the whole payload on one rank (the transfers not counted);
- stages: both ranks copying their own stage's bytes at once (memory bandwidth shared, as the writes share it).

``--layers`` scales the model (more decoder layers) to show how each path's time grows with its bytes.

Usage::

    .venv/bin/python -m bench.stage_sync [--syncs 5] [--layers 30 60] [--backends shm pull]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.common import load_note
from bench.ranks import spawn_ranks

PP = 2


def shapes_and_owners(layers: int) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """SmolLM2-135M's parameter shapes with ``layers`` decoder layers and each one's pipeline rank (``owners``);
    names with ``_`` for ``.`` (flat module)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from relayrl.models import resolve_model
    from relayrl.trainer.pp_weights import owners

    config = AutoConfig.from_pretrained(resolve_model("smollm2"))
    config.num_hidden_layers = layers
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    owner = owners(model, PP)
    flat = {name: name.replace(".", "_") for name in owner}
    shapes = {flat[n]: tuple(p.shape) for n, p in model.named_parameters()}
    return shapes, {flat[n]: rank for n, rank in owner.items()}


def value(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor each rank can rebuild to check what arrived (seeded by the name)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(zlib.crc32(name.encode())))


class Stage(torch.nn.Module):
    """This rank's parameters hold values; the other stage's are meta stand-ins."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], owner: dict[str, int], rank: int) -> None:
        super().__init__()
        for name, shape in shapes.items():
            mine = owner[name] == rank
            tensor = value(name, shape) if mine else torch.empty(shape, device="meta")
            self.register_parameter(name, torch.nn.Parameter(tensor, requires_grad=False))


class Client:
    """Stands in for the engines: maps the buffer at init and reads it back once, after the timed syncs."""

    def __init__(self) -> None:
        self.version, self.timeout_s = 0, 600.0
        self.seconds: dict[str, float] = {}
        self.receiver: Any = None
        self.layout: Any = None

    def init_weight_transfer_engine(self, info: dict) -> None:
        from relayrl.weightsync.layout import FlatLayout
        from relayrl.weightsync.pull import PullReceiver
        from relayrl.weightsync.shm import ShmReceiver

        self.layout = FlatLayout.from_dict(info["layout"])
        receiver = {"shm": ShmReceiver, "pull": PullReceiver}[info["transport"]]
        self.receiver = receiver(self.layout, info["channel"], 0)  # shm maps the file while it has a name

    def start_weight_update(self) -> None: ...

    def update_weights(self, info: dict) -> None: ...

    def finish_weight_update(self) -> None: ...


def gathered_source(stages: Any) -> Any:
    """The same policy as a plain ``WeightSource`` (not a ``StageSource``): the engine takes the one-sender path,
    rank 0 packing every tensor as ``gathered`` sends it there from its stage."""
    from vllm.distributed.weight_transfer.base import WeightSource

    class Gathered(WeightSource):
        def metadata(self) -> list:
            return stages.metadata()

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            return iter(stages)

    return Gathered()


def timed_syncs(engine: Any, client: Client, syncs: int) -> list[float]:
    """Seconds of each of ``syncs`` syncs after one warm-up, as rank 0 sees them (ranks start together)."""
    out = []
    for v in range(syncs + 1):
        client.version = v + 1
        dist.barrier()
        t0 = time.perf_counter()
        engine.send_weights()
        dist.barrier()
        out.append(time.perf_counter() - t0)
    return out[1:]


def check(client: Client, shapes: dict[str, tuple[int, ...]]) -> None:
    """Every tensor in the buffer is the one its stage holds (read through the engine side's receiver)."""
    from relayrl.weightsync.base import FlatUpdateInfo

    layout = client.layout
    data = client.receiver.receive(layout, FlatUpdateInfo(client.version, layout.digest))
    for name, view in layout.views(data):
        assert torch.equal(view, value(name, shapes[name])), name


def stage_floor(stage: torch.nn.Module) -> float:
    """Best of 3: this rank's own bytes copied once, both ranks at once."""
    own = [p for p in stage.parameters() if not p.is_meta]
    dests = [torch.empty_like(p) for p in own]
    best = float("inf")
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        for d, p in zip(dests, own):
            d.copy_(p)
        dist.barrier()
        best = min(best, time.perf_counter() - t0)
    return best


def trainer_engine(backend: str, rank: int, client: Client, source: Any) -> Any:
    """The backend's real trainer engine with the product's defaults (``/dev/shm``; pull: a private store)."""
    from relayrl.config.weightsync import WeightSyncConfig
    from relayrl.weightsync.pull import PullTrainerEngine, PullTrainerInitInfo
    from relayrl.weightsync.shm import ShmTrainerEngine, ShmTrainerInitInfo

    bucket = WeightSyncConfig().bucket_mb << 20
    if backend == "shm":
        info = ShmTrainerInitInfo(rank=rank, shm_dir=WeightSyncConfig().shm_dir, bucket_bytes=bucket)
        return ShmTrainerEngine.trainer_init(info, client=client, source=source)
    return PullTrainerEngine.trainer_init(
        PullTrainerInitInfo(rank=rank, bucket_bytes=bucket), client=client, source=source
    )


def worker(rank: int, backend: str, out: str, layers: int, syncs: int) -> None:
    from relayrl.weightsync.stages import StageSource

    shapes, owner = shapes_and_owners(layers)
    stage = Stage(shapes, owner, rank)
    group = dist.group.WORLD
    assert group is not None
    stages = StageSource(stage, owner, group)
    result: dict[str, Any] = {"floor": stage_floor(stage)}
    for path, source in (("rank 0", gathered_source(stages)), ("stages", stages)):
        client = Client()
        engine = trainer_engine(backend, rank, client, source)
        result[path] = timed_syncs(engine, client, syncs)
        if rank == 0:
            check(client, shapes)
        if hasattr(engine, "shutdown"):
            engine.shutdown()  # pull: its private store goes
        del engine
    torch.save(result, f"{out}.{rank}")


def run_case(backend: str, layers: int, syncs: int) -> dict[str, float]:
    from bench.weight_sync import memcpy_gbps

    shapes, owner = shapes_and_owners(layers)
    sizes = [sum(torch.Size(s).numel() * 4 for n, s in shapes.items() if owner[n] == r) for r in range(PP)]
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/result"
        spawn_ranks(worker, PP, Path(tmp) / "store", backend, out, layers, syncs)
        rank0 = torch.load(f"{out}.0")
    total = sum(sizes)
    return {
        "MB": total / 1e6,
        "stage MB": max(sizes) / 1e6,
        "rank 0": statistics.median(rank0["rank 0"]),
        "stages": statistics.median(rank0["stages"]),
        "floor rank 0": total / memcpy_gbps(total) / 1e9,
        "floor stages": rank0["floor"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--syncs", type=int, default=5, help="timed syncs per path (after 1 warm-up)")
    parser.add_argument("--layers", type=int, nargs="+", default=[30, 60], help="decoder layers (SmolLM2: 30)")
    parser.add_argument("--backends", nargs="+", default=["shm", "pull"], choices=["shm", "pull"])
    args = parser.parse_args()
    print(load_note())
    print(f"pp={PP}, fp32, median of {args.syncs} syncs; floors best of 3\n")
    print(
        "| backend | layers | MB (biggest stage) | rank 0 path | its floor | stages | their floor | rank 0 / stages |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for backend, layers in ((b, n) for b in args.backends for n in args.layers):
        r = run_case(backend, layers, args.syncs)
        print(
            f"| {backend} | {layers} | {r['MB']:.0f} ({r['stage MB']:.0f}) | {r['rank 0'] * 1e3:.0f} ms | "
            f"{r['floor rank 0'] * 1e3:.0f} ms ({r['rank 0'] / r['floor rank 0']:.2f}x) | {r['stages'] * 1e3:.0f} ms | "
            f"{r['floor stages'] * 1e3:.0f} ms ({r['stages'] / r['floor stages']:.2f}x) | "
            f"{r['rank 0'] / r['stages']:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
