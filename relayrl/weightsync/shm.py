"""``shm`` backend: the model as one flat buffer in a /dev/shm file, written once, mapped by every engine.

Why: on one host nothing beats writing the bytes once into memory that every engine maps. The
trainer's rank 0 writes each gathered tensor straight into its slot of the mapping (no bucket
buffer needed: the mapping is the buffer), then stamps the header with the version; engine
workers map the same file at init and, on commit, load from views into the mapping (zero-copy
reads). The file is allocated and pre-faulted once, when the transfer is set up, and reused for
every version, so a sync pays no tmpfs page faults.

Transaction: the header holds ``version = -1`` while the trainer writes and the real version only
after the last byte; the engine's verify refuses any other stamp, so a payload the trainer did not
finish (it died mid-write) is never loaded. Versions are strictly sequential (the trainer sends
v+1 only after every engine committed or aborted v), so one buffer suffices.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import TrainerInitInfo, WeightSource

from relayrl.weightsync.base import DeferredError, FlatTrainerEngine, FlatUpdateInfo, drain, one_thread
from relayrl.weightsync.layout import FlatLayout, bucket_views, pack
from relayrl.weightsync.stages import StageSource

HEADER_BYTES = 64
MAGIC = int.from_bytes(b"relayrl1", "little")
WRITING = -1


def create_private(path: str, nbytes: int) -> None:
    """A new ``nbytes`` file readable by this user only; fails if anything (a planted symlink) is there."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)


class ShmRegion:
    """``[header | flat payload]`` in a shared file mapping: header = int64 [magic, version, digest]."""

    def __init__(self, path: str, nbytes: int) -> None:
        self.path = path
        self.buffer = torch.from_file(path, shared=True, size=HEADER_BYTES + nbytes, dtype=torch.uint8)
        self.header = self.buffer[:HEADER_BYTES].view(torch.int64)
        self.data = self.buffer[HEADER_BYTES:]

    @classmethod
    def create(cls, shm_dir: str, nbytes: int) -> ShmRegion:
        """A new file of the right size in ``shm_dir``, every page touched now rather than mid-sync."""
        if not Path(shm_dir).is_dir():
            raise FileNotFoundError(
                f"weightsync.shm_dir={shm_dir} is not a directory; set it to an existing (ideally tmpfs) directory"
            )
        path = os.path.join(shm_dir, f"relayrl-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}.bin")
        create_private(path, HEADER_BYTES + nbytes)
        region = cls(path, nbytes)
        region.buffer.zero_()
        region.header[0] = MAGIC
        region.header[1] = WRITING
        return region

    def begin(self) -> None:
        self.header[1] = WRITING

    def commit(self, version: int, digest: str) -> None:
        self.header[2] = _digest_int(digest)
        self.header[1] = version

    def check(self, version: int, digest: str) -> None:
        """Raise unless the payload is a complete write of ``version`` cut by layout ``digest``."""
        magic, stamped, stamped_digest = (int(x) for x in self.header[:3])
        if magic != MAGIC:
            raise ValueError(f"{self.path} is not a relayrl weight buffer (bad magic)")
        if stamped != version:
            state = "is mid-write" if stamped == WRITING else f"holds v{stamped}"
            raise ValueError(
                f"shm payload {state}, expected a complete v{version}; the trainer did not "
                "finish writing it (the engine keeps its previous weights)"
            )
        if stamped_digest != _digest_int(digest):
            raise ValueError(f"shm payload v{version} was cut by another layout; re-initialise the transfer")

    def unlink(self) -> None:
        Path(self.path).unlink(missing_ok=True)


def _share_region(region: ShmRegion | None, nbytes: int, group: dist.ProcessGroup) -> ShmRegion:
    """Rank 0's new mapping (``region``), mapped by every other stage writer of ``group`` too: its path is
    broadcast, each maps it, and an all-reduce says all have before rank 0 goes on (and lets the name go). A
    writer that cannot map it raises, and so does rank 0, before any engine is told of the file."""
    path = [region.path if region is not None else None]
    dist.broadcast_object_list(path, src=dist.get_global_rank(group, 0), group=group)
    shared, error = region, DeferredError()  # raised after the all-reduce, or rank 0 would wait for ever
    if shared is None:
        with error.catch():
            shared = ShmRegion(cast(str, path[0]), nbytes)
    mapped = torch.tensor([0 if error else 1], dtype=torch.int32)
    dist.all_reduce(mapped, op=dist.ReduceOp.MIN, group=group)
    error.reraise()
    if shared is None or not mapped.item():
        raise RuntimeError(f"a pipeline stage could not map the shm weight buffer {path[0]}; see its error")
    return shared


def _digest_int(digest: str) -> int:
    return int(digest[:15], 16)  # 60 bits: fits a signed int64 header field


@dataclass
class ShmTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = "relayrl_shm"

    shm_dir: str = "/dev/shm"
    bucket_bytes: int = 64 << 20
    wire_dtype: str | None = None


class ShmTrainerEngine(FlatTrainerEngine):
    """Rank 0 writes every tensor into the mapping, stamps it and has the engines verify it. Over a pipelined
    policy (a ``StageSource``) each stage writes its own tensors instead (``send_stages``)."""

    init_info_cls = ShmTrainerInitInfo
    region: ShmRegion | None = None  # the sender's mapping (and each stage writer's), from trainer_init
    dests: list[list[torch.Tensor]]  # each bucket's typed views into the mapping

    @classmethod
    def trainer_init(
        cls, init_info: ShmTrainerInitInfo, *, client: Any, source: WeightSource | None = None
    ) -> ShmTrainerEngine:
        engine = cls.planned(init_info, client, source)
        layout = engine.layout
        stages = source if isinstance(source, StageSource) else None
        if not engine.is_sender and not (stages is not None and stages.writes):
            return engine
        region = ShmRegion.create(init_info.shm_dir, layout.nbytes) if engine.is_sender else None
        try:
            if stages is not None:  # every stage writer maps the file while it still has a name
                region = _share_region(region, layout.nbytes, stages.stage_group)
            assert region is not None  # created (sender) or mapped (stage writer)
            engine.region = region
            if engine.is_sender:
                client.init_weight_transfer_engine(
                    {"layout": layout.to_dict(), "transport": "shm", "channel": {"path": region.path}}
                )
        finally:
            # Every engine has mapped it (or failed): the name can go now, the memory stays until the
            # last mapping closes, so even a SIGKILLed trainer leaves nothing behind in /dev/shm.
            if engine.is_sender and region is not None:
                region.unlink()
        engine.dests = [bucket_views(layout, b, region.data, base=0) for b in layout.buckets]
        return engine

    def send_weights(self) -> None:
        if isinstance(self.source, StageSource):
            self.send_stages(self.source)
        else:
            super().send_weights()

    def send_stages(self, source: StageSource) -> None:
        """One version written by every stage into the mapping, then stamped by rank 0.

        Rank 0 marks the buffer mid-write, the stage writers (the first rank of each stage) write their own
        tensors into their slots, and an all-reduce over the writers says whether all of them finished. Only then
        does rank 0 stamp the version and have the engines verify it; otherwise it raises, the stamp stays
        mid-write and the engines keep the previous version. Every rank of a stage takes part in its gathers
        whatever happens, so no peer hangs; a writer's own error is raised after the all-reduce."""
        writes = self.region is not None
        error = DeferredError()  # raised after the all-reduce, or the other writers would hang
        t0 = time.perf_counter()
        if self.is_sender:
            with error.catch():
                self.client.start_weight_update()
                cast(ShmRegion, self.region).begin()
        if writes:
            dist.barrier(group=source.stage_group)  # the buffer is marked mid-write before anyone writes
        named = source.own()
        try:
            with error.catch():
                if writes and not error:
                    with one_thread():
                        self._write(named)
        finally:
            drain(named)  # the stage's gathers finish on every rank
        done = torch.tensor([0 if error else 1], dtype=torch.int32)
        if writes:
            dist.all_reduce(done, op=dist.ReduceOp.MIN, group=source.stage_group)
        error.reraise()
        if not self.is_sender:
            return
        version, digest = self.client.version, self.layout.digest
        if not done.item():
            raise RuntimeError(f"a pipeline stage did not write its weights of v{version}; the engines keep theirs")
        self._check_deadline(t0, version)
        cast(ShmRegion, self.region).commit(version, digest)
        self.client.update_weights({"version": version, "digest": digest})
        self.client.seconds["transfer"] = time.perf_counter() - t0
        self.client.finish_weight_update()

    def _write(self, named: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Each tensor ``named`` yields into its slot, by name, in the wire dtype."""
        index = {slot.name: i for i, slot in enumerate(self.layout.slots)}
        views = [view for bucket in self.dests for view in bucket]
        for name, tensor in named:
            i = index[name]
            self.layout.check(name, tensor, i)
            views[i].copy_(tensor)

    def _check_deadline(self, t0: float, version: int) -> None:
        """The write is the trainer's own work (its gathers included): slower than ``timeout_s``, it aborts the
        sync as a slow engine would."""
        if (seconds := time.perf_counter() - t0) > self.client.timeout_s:
            raise TimeoutError(
                f"gathering and writing v{version} took {seconds:.1f}s > weightsync.timeout_s={self.client.timeout_s:g}"
            )

    def transfer(self, named: Any, info: dict[str, Any]) -> None:
        """Write every bucket into the mapping, stamp it, then have the engines verify it.

        The write is the trainer's own work (FSDP gathers included), so its deadline is checked
        here: a write slower than ``timeout_s`` aborts the sync like a slow engine would.
        """
        region = self.region
        if region is None:
            raise RuntimeError("only the sending rank transfers, into the mapping its init created")
        t0 = time.perf_counter()
        region.begin()
        for bucket, dests in zip(self.layout.buckets, self.dests):
            pack(self.layout, bucket, named, dests)
        self._check_deadline(t0, info["version"])
        region.commit(info["version"], info["digest"])
        self.client.update_weights(info)

    def shutdown(self) -> None:
        self.region = None  # the file was unlinked at init; dropping the mapping frees the memory


class ShmReceiver:
    """Engine end: map the trainer's file once; every version is read in place (zero-copy views)."""

    def __init__(self, layout: FlatLayout, channel: dict[str, Any], rank: int) -> None:
        self.region: ShmRegion | None = ShmRegion(channel["path"], layout.nbytes)

    def receive(self, layout: FlatLayout, info: FlatUpdateInfo) -> torch.Tensor:
        if self.region is None:
            raise RuntimeError("the shm receiver was closed")
        self.region.check(info.version, info.digest)
        return self.region.data

    def close(self) -> None:
        self.region = None
