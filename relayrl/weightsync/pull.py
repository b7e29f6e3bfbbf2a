"""``pull`` backend: the trainer publishes each version once to a versioned store; every engine fetches it.

Why: a push needs a path from the trainer to every engine (a shared mapping, a gloo group). Engines that no push
can reach (outside the Ray cluster, behind a firewall, joining late) can still read a directory: a shared
filesystem or a mounted bucket (``weightsync.pull_dir``; by default a private directory in /dev/shm, one host).
``store.py`` has the layout and the checks, ``store_write.py`` the atomic publish and retention.

Transaction: rank 0 writes ``v<version>`` (gathered tensors straight into the payload file, a checksum per
tensor; under pipeline stages each stage writes its own part, ``send_stages``) and renames it into place only
after the last byte and the manifest are on disk, then asks the engines
to update (``weightsync.pull_when=sync``). With ``pull_when=admission`` the sync stops at the rename: no engine
is paused or asked, and each replica fetches the newest version itself when it is given a call that needs it
(``Rollout.fetch_version``), through the same start / receive / commit as a sync. Each engine reads the
version into its staging buffer and checks the manifest's version, layout digest and writer and every tensor's
checksum before returning it, so a missing store or a damaged payload fails that engine's update in one line and
the transaction aborts with the previous weights serving.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import TrainerInitInfo, WeightSource

from relayrl.weightsync.base import DeferredError, FlatTrainerEngine, FlatUpdateInfo, drain, one_thread
from relayrl.weightsync.layout import FlatLayout
from relayrl.weightsync.stages import StageSource
from relayrl.weightsync.store import PAYLOAD, check_reachable, fetch
from relayrl.weightsync.store_write import Draft, StoreWriter, write_payload, write_slots


@dataclass
class PullTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = "relayrl_pull"

    pull_dir: str = ""  # "" : a private store (StoreWriter.open)
    keep: int = 2
    bucket_bytes: int = 64 << 20
    wire_dtype: str | None = None
    publish_only: bool = False  # pull_when=admission: the sync publishes; each replica fetches when a call needs it


class PullTrainerEngine(FlatTrainerEngine):
    init_info_cls = PullTrainerInitInfo
    store: StoreWriter | None = None  # the sender's, from _connect
    publish_only: bool = False  # PullTrainerInitInfo.publish_only
    layout_dict: dict[str, Any]  # the sender's: layout.to_dict(), sent at init and written in every manifest

    @classmethod
    def trainer_init(
        cls, init_info: PullTrainerInitInfo, *, client: Any, source: WeightSource | None = None
    ) -> PullTrainerEngine:
        engine = cls.planned(init_info, client, source)
        engine.publish_only = init_info.publish_only
        if engine.is_sender:
            engine._connect(init_info)
        return engine

    def send_weights(self) -> None:
        if isinstance(self.source, StageSource):
            self.send_stages(self.source)
        else:
            self.send_gathered()

    def send_stages(self, source: StageSource) -> None:
        """One version written by every pipeline stage into rank 0's draft, then published by rank 0.

        Rank 0 opens the engines' transaction (not under ``publish_only``) and a draft, and tells the stage writers
        (the first rank of each stage) its payload file; each writes its own tensors at their offsets and sends rank 0
        their checksums, or None if it failed. Only when every tensor has its checksum does rank 0 publish the version
        and have the engines fetch it; otherwise the draft goes, nothing is published and the engines keep theirs.
        Every rank of a stage takes part in its gathers whatever happens; a writer's own error is raised last."""
        version, t0, named = self.client.version, time.perf_counter(), source.own()
        error = DeferredError()  # raised after the gather, or the other writers would hang
        with contextlib.ExitStack() as stack:
            draft, mine = None, None
            if self.is_sender:
                with error.catch():
                    if not self.publish_only:
                        self.client.start_weight_update()
                    draft = stack.enter_context(cast(StoreWriter, self.store).draft(version, self.layout.nbytes))
            path = _share_path(source, None if draft is None else str(draft.tmp / PAYLOAD))
            try:
                with error.catch():
                    if path is not None:
                        with one_thread():
                            mine = write_slots(path, self.layout, named)
            finally:
                drain(named)  # the stage's gathers finish on every rank
            checksums = self._gathered_checksums(source, None if error else mine)
            error.reraise()
            if not self.is_sender:
                return
            if checksums is None:
                raise RuntimeError(f"a pipeline stage did not write its part of v{version}; nothing is published")
            self._check_deadline(t0, version)
            cast(Draft, draft).publish(self.layout_dict, self.layout.digest, checksums)
        if self.publish_only:
            self.client.seconds["publish"] = time.perf_counter() - t0
            return
        self.client.update_weights({"version": version, "digest": self.layout.digest})
        self.client.seconds["transfer"] = time.perf_counter() - t0
        self.client.finish_weight_update()

    def _gathered_checksums(self, source: StageSource, mine: dict[int, str] | None) -> list[str] | None:
        """Every stage writer's checksums (``mine``: slot index -> checksum, None if it failed) gathered to rank 0:
        all of them in layout order there, or None if a writer failed (and on every other rank)."""
        if not source.writes:
            return None
        group = source.stage_group
        got: list[Any] | None = [None] * dist.get_world_size(group) if self.is_sender else None
        dist.gather_object(mine, got, dst=dist.get_global_rank(group, 0), group=group)
        if got is None or any(part is None for part in got):
            return None
        merged = {i: c for part in got for i, c in part.items()}
        if len(merged) != len(self.layout.slots):  # owners and layout disagree: a bug, not a failed write
            raise RuntimeError(f"the pipeline stages wrote {len(merged)} of {len(self.layout.slots)} tensors")
        return [merged[i] for i in range(len(self.layout.slots))]

    def _connect(self, info: PullTrainerInitInfo) -> None:
        """Open the store, then tell the engines where it is and whose versions to accept."""
        self.store = store = StoreWriter.open(info.pull_dir, info.keep)
        self.layout_dict = self.layout.to_dict()
        channel = {"dir": str(store.root), "writer": store.writer}
        try:
            self.client.init_weight_transfer_engine(
                {"layout": self.layout_dict, "transport": "pull", "channel": channel}
            )
        except BaseException:
            self.shutdown()  # the caller never gets this engine to shut down: a private store would stay
            raise

    def send_gathered(self) -> None:
        """``publish_only``: write the version to the store and stop there (no engine paused or asked, so no
        transaction to open or commit); otherwise the transaction of ``FlatTrainerEngine``."""
        if not self.publish_only:
            super().send_weights()
            return
        named = iter(self.source)
        t0 = time.perf_counter()
        try:
            if self.is_sender:
                with one_thread():
                    self.publish(named, self.client.version)
        finally:
            drain(named)  # the gathers are collectives: every rank finishes them
        self.client.seconds["publish"] = time.perf_counter() - t0

    def transfer(self, named: Any, info: dict[str, Any]) -> None:
        """Publish the version, then have the engines fetch it."""
        self.publish(named, info["version"])
        self.client.update_weights(info)

    def publish(self, named: Any, version: int) -> None:
        """Write ``version`` into the store (the trainer's own work, so its deadline is checked here, before the
        rename: a write slower than ``timeout_s`` aborts the sync and publishes nothing)."""
        store = self.store
        if store is None:
            raise RuntimeError("only the sending rank transfers, into the store its init opened")
        t0 = time.perf_counter()
        with store.draft(version, self.layout.nbytes) as draft:
            checksums = write_payload(draft, self.layout, named)
            self._check_deadline(t0, version)
            draft.publish(self.layout_dict, self.layout.digest, checksums)

    def _check_deadline(self, t0: float, version: int) -> None:
        if (seconds := time.perf_counter() - t0) > self.client.timeout_s:
            raise TimeoutError(
                f"gathering and writing v{version} took {seconds:.1f}s > weightsync.timeout_s={self.client.timeout_s:g}"
            )

    def shutdown(self) -> None:
        if self.store is not None:
            self.store.close()  # a private store goes; a shared one keeps its versions for other readers
            self.store = None


class PullReceiver:
    """Engine end: a staging buffer the model's size, pre-faulted once; each version is read into it and checked
    there (``store.fetch``), so what is loaded is what was checked."""

    def __init__(self, layout: FlatLayout, channel: dict[str, Any], rank: int) -> None:
        self.root, self.writer = Path(channel["dir"]), channel["writer"]
        check_reachable(self.root)  # early, at init; every fetch checks again
        self.staging = torch.zeros(layout.nbytes, dtype=torch.uint8)

    def receive(self, layout: FlatLayout, info: FlatUpdateInfo) -> torch.Tensor:
        fetch(self.root, info.version, layout, self.writer, self.staging)
        return self.staging

    def close(self) -> None:
        self.staging = torch.empty(0, dtype=torch.uint8)


def _share_path(source: StageSource, path: str | None) -> str | None:
    """Rank 0's draft payload ``path`` (None if it has none), told to every stage writer; None elsewhere."""
    if not source.writes:
        return None
    box = [path]
    dist.broadcast_object_list(box, src=dist.get_global_rank(source.stage_group, 0), group=source.stage_group)
    return box[0]
