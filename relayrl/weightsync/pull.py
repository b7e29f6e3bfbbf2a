"""``pull`` backend: the trainer publishes each version once to a versioned store; every engine fetches it.

Why: a push needs a path from the trainer to every engine (a shared mapping, a gloo group). Engines that no push
can reach (outside the Ray cluster, behind a firewall, joining late) can still read a directory: a shared
filesystem or a mounted bucket (``weightsync.pull_dir``; by default a private directory in /dev/shm, one host).
``store.py`` has the layout, the atomic publish, retention and the checks.

Transaction: rank 0 writes ``v<version>`` (gathered tensors straight into the payload file, a checksum per
tensor) and renames it into place only after the last byte and the manifest are on disk, then asks the engines
to update (``weightsync.pull_when=sync``). With ``pull_when=admission`` the sync stops at the rename: no engine
is paused or asked, and each replica fetches the newest version itself when it is given a call that needs it
(``Rollout.fetch_version``), through the same start / receive / commit as a sync. Each engine reads the
version into its staging buffer and checks the manifest's version, layout digest and writer and every tensor's
checksum before returning it, so a missing store or a damaged payload fails that engine's update in one line and
the transaction aborts with the previous weights serving.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import TrainerInitInfo, WeightSource

from relayrl.weightsync.base import FlatTrainerEngine, FlatUpdateInfo, drain, one_thread
from relayrl.weightsync.layout import FlatLayout
from relayrl.weightsync.store import StoreWriter, check_reachable, fetch, write_payload


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

    def send_weights(self) -> None:
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
            if (seconds := time.perf_counter() - t0) > self.client.timeout_s:
                raise TimeoutError(
                    f"gathering and writing v{version} took {seconds:.1f}s > "
                    f"weightsync.timeout_s={self.client.timeout_s:g}"
                )
            draft.publish(self.layout_dict, self.layout.digest, checksums)

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
