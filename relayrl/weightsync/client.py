"""Trainer-side control plane: vLLM's ``VLLMWeightSyncClient`` over relayrl's RolloutActors.

A trainer engine (ours or vLLM's own) drives engines through four calls; this client fans each out
to every rollout replica, bounds it by a deadline, and turns a failure into one line naming the
stage and the replica. It also carries the version being sent (``begin``), so that commit labels
the engines with it, and it records seconds per stage for the sync's metrics.
"""

from __future__ import annotations

import time
from typing import Any

COMMIT_GRACE_S = 60.0  # commit (reload into the model) gets at least this long, whatever timeout_s is


def abort_update(rollouts: list[Any], reason: str, timeout_s: float) -> None:
    """Tell every replica to drop a staged payload and resume on its old weights: the one abort path, used
    by the trainer when its transaction fails and by the driver when the trainer failed without saying so.
    Best effort: waits at most ``max(timeout_s, COMMIT_GRACE_S)`` and raises nothing, so the sync's own
    error is the one that surfaces; a dead replica cannot be told, and its restart is the controller's
    business."""
    import ray

    refs = [r.abort_weight_update.remote(reason) for r in rollouts]
    ray.wait(refs, num_returns=len(refs), timeout=max(timeout_s, COMMIT_GRACE_S))


class WeightSyncError(RuntimeError):
    """A sync failed or timed out; engines were told to abort and keep their previous weights."""


class RolloutClient:
    """Talks to ``rollouts`` (RolloutActor handles); replica ``i`` has ``workers[i]`` vLLM workers."""

    def __init__(self, rollouts: list[Any], workers: list[int], timeout_s: float):
        if len(workers) != len(rollouts):
            raise ValueError(f"{len(rollouts)} rollout replicas but {len(workers)} worker counts")
        self.rollouts = rollouts
        self.workers = workers
        self.timeout_s = timeout_s
        self.version = 0
        self.seconds: dict[str, float] = {}
        self.stall_s = 0.0

    @property
    def num_workers(self) -> int:
        return sum(self.workers)

    def begin(self, version: int) -> None:
        """Set the version the next start/update/finish round carries; reset the stage clock."""
        self.version = version
        self.seconds = {}
        self.stall_s = 0.0

    # ---- vLLM's VLLMWeightSyncClient protocol ----------------------------------------------------
    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Same payload to every replica, except that ``rank_offset`` (a group rank) moves past the
        workers of the replicas before it: vLLM numbers workers from 0 within each engine."""
        offsets = [sum(self.workers[:i]) for i in range(len(self.rollouts))]
        payloads = [
            {**init_info, "rank_offset": init_info["rank_offset"] + off} if "rank_offset" in init_info else init_info
            for off in offsets
        ]
        self._all("init", [r.init_weight_transfer.remote(p) for r, p in zip(self.rollouts, payloads)])

    def start_weight_update(self) -> None:
        self._all("start", [r.start_weight_update.remote(self.version, self.timeout_s) for r in self.rollouts])

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._all("receive", [r.update_weights.remote(update_info) for r in self.rollouts])

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = self.version if weight_version is None else int(weight_version)
        stalls = self._all(
            "commit",
            [r.finish_weight_update.remote(version) for r in self.rollouts],
            max(self.timeout_s, COMMIT_GRACE_S),
        )
        self.stall_s = max(stalls)

    # ---- relayrl's addition ----------------------------------------------------------------------
    def abort(self, reason: str) -> None:
        abort_update(self.rollouts, reason, self.timeout_s)

    def _all(self, stage: str, refs: list[Any], timeout_s: float | None = None) -> list[Any]:
        """Wait for one stage on every replica until a shared deadline; name the first that fails."""
        import ray

        t0 = time.perf_counter()
        deadline = t0 + (self.timeout_s if timeout_s is None else timeout_s)
        out = []
        for i, ref in enumerate(refs):
            try:
                out.append(ray.get(ref, timeout=max(deadline - time.perf_counter(), 0.0)))
            except ray.exceptions.GetTimeoutError:
                raise WeightSyncError(
                    f"weight sync v{self.version}: stage {stage!r} timed out on rollout "
                    f"replica {i} (weightsync.timeout_s={self.timeout_s:g}); raise it if "
                    "the weights are large"
                ) from None
            except Exception as exc:  # any actor/engine error becomes one named line
                raise WeightSyncError(
                    f"weight sync v{self.version}: stage {stage!r} failed on rollout replica {i}: {last_line(exc)}"
                ) from exc
        self.seconds[stage] = time.perf_counter() - t0
        return out


def last_line(exc: BaseException) -> str:
    """The informative line of a (possibly remote, multi-line) exception."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else repr(exc)
