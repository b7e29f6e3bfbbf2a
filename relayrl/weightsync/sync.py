"""The trainer side of a sync: connect on first use, send each version, abort cleanly on failure.

Every trainer rank holds a ``TrainerSync`` and calls ``sync(version)`` together (the gathers are
collectives); only rank 0 talks to the engines. A failed sync tells the engines to abort (they
keep serving the previous version), drops the trainer engine so the next sync re-initialises the
transfer (a timed-out process group cannot be reused), and raises one ``WeightSyncError`` line.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightSource

from relayrl.config import WeightSyncConfig
from relayrl.monitor.schema import (
    WEIGHTSYNC_BYTES,
    WEIGHTSYNC_GBPS,
    WEIGHTSYNC_STAGE_S,
    WEIGHTSYNC_STALL_S,
    WEIGHTSYNC_TOTAL_S,
    WEIGHTSYNC_VERSION,
)
from relayrl.weightsync import BACKENDS, register_with_vllm
from relayrl.weightsync.client import RolloutClient, WeightSyncError, last_line


class TrainerSync:
    """``source``: this rank's weights (vLLM ``ModuleSource`` over the FSDP model, or a dict source)."""

    def __init__(
        self,
        cfg: WeightSyncConfig,
        source: WeightSource,
        rank: int,
        rollouts: list[Any],
        workers: list[int],
        wire_dtype: str | None = None,
    ):
        register_with_vllm()
        self.cfg, self.source, self.rank, self.wire_dtype = cfg, source, rank, wire_dtype
        self.client = RolloutClient(rollouts, workers, cfg.timeout_s)
        self.engine: Any = None

    def sync(self, version: int) -> dict[str, float]:
        """Move the weights to every engine as ``version``; return per-stage metrics (rank 0)."""
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        self.client.begin(version)
        t0 = time.perf_counter()
        try:
            if self.engine is None:
                info = BACKENDS[self.cfg.backend].trainer_info(
                    self.cfg, self.rank, self.client.num_workers, self.wire_dtype
                )
                self.engine = WeightTransferTrainerFactory.trainer_init(info, client=self.client, source=self.source)
                self.client.seconds["connect"] = time.perf_counter() - t0
            self.engine.send_weights()
        except BaseException as exc:
            self._fail(exc)
            if isinstance(exc, WeightSyncError):
                raise
            raise WeightSyncError(
                f"weight sync v{version} failed on trainer rank {self.rank}: {last_line(exc)}"
            ) from exc
        return self.metrics(time.perf_counter() - t0)

    def _fail(self, exc: BaseException) -> None:
        if self.rank == 0:
            self.client.abort(last_line(exc))
        if self.engine is not None:
            self.engine.shutdown()
        self.engine = None

    def metrics(self, total_s: float) -> dict[str, float]:
        if hasattr(self.engine, "layout"):
            nbytes = float(self.engine.layout.nbytes)  # what moved: wire dtype, aligned
        else:  # vLLM's own engines: the source's bytes
            nbytes = float(sum(torch.Size(m.shape).numel() * m.dtype.itemsize for m in self.source.metadata()))
        seconds = self.client.seconds  # vLLM's own engines report no trainer-side transfer: use receive
        moved = seconds.get("transfer", seconds.get("receive", 0.0)) + seconds.get("commit", 0.0)
        out = {WEIGHTSYNC_STAGE_S.format(stage=k): v for k, v in self.client.seconds.items()}
        out.update(
            {
                WEIGHTSYNC_BYTES: nbytes,
                WEIGHTSYNC_TOTAL_S: total_s,
                WEIGHTSYNC_GBPS: nbytes / moved / 1e9 if moved > 0 else 0.0,
                WEIGHTSYNC_STALL_S: self.client.stall_s,
                WEIGHTSYNC_VERSION: float(self.client.version),
            }
        )
        return out

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
