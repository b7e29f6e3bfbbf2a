"""Run checkpoints: trainer shards (DCP) + the driver's state, written atomically, found by ``resume``.

Layout under the run directory::

    checkpoints/step_000040/
        dcp/                 trainer model + optimizer shards (torch Distributed Checkpoint)
        rng-rank<r>.pt       each rank's RNG state (tensors only)
        driver.json          step, sampler cursor, prompts started but not yet trained (re-issued first)
        COMPLETE             written once the above are on disk
        manifest.json        written last: size and sha256 of every other file (``trainer.manifest``)

Everything is written into ``.step_000040.tmp``; once every rank's shards are on disk, ``driver.json``,
``COMPLETE`` and the manifest are written, every file and directory is fsynced, and the directory is
renamed (then its parent fsynced). A crash or a failed write at any point leaves either the previous
checkpoints or a ``.tmp`` directory that ``latest`` never considers and the next save deletes; a failed
write costs that checkpoint, not the run (``Checkpointer._commit_or_drop``). ``checkpoints/final`` (HF
format) is written the same way (``durable_dir``).

Resuming loads only a checkpoint that ``manifest.verify`` accepts (this user's, unchanged since its
save): ``find_resume`` skips, with one line each, the newest ones that fail and takes the newest that
passes, as it already passes over ``.tmp`` directories; a checkpoint named explicitly is refused.

``Checkpointer`` writes asynchronously (``run.checkpoint_async``): the trainer stages its shards and
writes them in the background while training goes on; the checkpoint is committed (driver state,
``COMPLETE``, rename) at the first step that finds the write done, before the next save, and at the
end of the run. The driver state is the one of the step the shards belong to, captured at save time.
In async mode the batches in flight at save time are not kept (they hold refs into a dead cluster);
their prompts are, and are generated again after resuming, under the restored weights.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayrl.monitor.runs import is_live
from relayrl.trainer import manifest
from relayrl.trainer.manifest import UntrustedCheckpoint

logger = logging.getLogger(__name__)
MARKER = "COMPLETE"


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def complete(run_dir: Path) -> list[Path]:
    """The complete checkpoints in ``run_dir``, newest (highest step) first."""
    done = [p for p in (Path(run_dir) / "checkpoints").glob("step_*") if (p / MARKER).exists()]
    return sorted(done, key=lambda p: int(p.name.removeprefix("step_")), reverse=True)


def latest(run_dir: Path) -> Path | None:
    """The complete checkpoint with the highest step in ``run_dir`` (None if there is none)."""
    return next(iter(complete(run_dir)), None)


def latest_verified(run_dir: Path) -> Path | None:
    """The newest complete checkpoint that ``manifest.verify`` accepts; each newer one it refuses is
    skipped with one line, as a crash's ``.tmp`` is: an engineer resuming after a crash wants the last
    good state, and loses only the steps since it (they are trained again)."""
    for ckpt in complete(run_dir):
        try:
            manifest.verify(ckpt)
            return ckpt
        except UntrustedCheckpoint as exc:
            logger.warning("relayrl: skipping %s: %s", ckpt.name, exc)
    return None


def find_resume(output_dir: str, name: str, resume: str) -> tuple[Path, Path] | None:
    """``(run_dir, checkpoint)`` to resume from: ``resume=auto`` takes the newest run named ``name`` under
    ``output_dir`` that has a verified checkpoint and is not still running on this host (another driver
    is writing it; None: start fresh); otherwise ``resume`` is a path to a checkpoint (refused with
    ``UntrustedCheckpoint`` if it fails verification) or to a run directory (its newest verified one)."""
    if resume == "auto":
        runs = sorted(Path(output_dir).glob(f"{name}-*"), key=lambda p: p.stat().st_mtime, reverse=True)
        for run in runs:
            if not is_live(run) and (ckpt := latest_verified(run)) is not None:
                return run, ckpt
        return None
    path = Path(resume)
    if (path / MARKER).exists():
        manifest.verify(path)
        return path.parent.parent, path
    if (ckpt := latest_verified(path)) is not None:
        return path, ckpt
    raise FileNotFoundError(
        f"run.resume={resume} holds no complete, verified checkpoint; point it at "
        "runs/<id> or runs/<id>/checkpoints/step_N, or use run.resume=auto"
    )


def driver_state(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / "driver.json").read_text())


# ---- durable writes ----------------------------------------------------------------------------------
def fsync_path(path: Path) -> None:
    """fsync one file or directory (a directory's fsync makes its entries, e.g. a rename, durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` and fsync it before returning."""
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then every directory bottom-up (their entries)."""
    for dirpath, _, files in os.walk(root, topdown=False):
        for name in files:
            fsync_path(Path(dirpath) / name)
        fsync_path(Path(dirpath))


def publish(tmp: Path, final: Path) -> None:
    """Make the finished directory ``tmp`` appear as ``final`` in one rename, durably: an older ``final``
    is moved aside first (a directory rename cannot replace a non-empty one) and deleted after."""
    fsync_tree(tmp)
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_path(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def temp_dir(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp")


def durable_dir(final: Path, write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` fills a fresh temporary directory that is then published as ``final``."""
    tmp = temp_dir(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    publish(tmp, final)
    return final


def clean_temp(checkpoints: Path) -> None:
    """Delete what a crashed save left behind (``.step_N.tmp``, ``.final.tmp``, ``.*.old``)."""
    for leftover in list(checkpoints.glob(".*.tmp")) + list(checkpoints.glob(".*.old")):
        shutil.rmtree(leftover, ignore_errors=True)


def prune(checkpoints: Path, keep: int) -> None:
    """Keep only the newest ``keep`` complete ``step_*`` checkpoints."""
    done = sorted((p for p in checkpoints.glob("step_*") if (p / MARKER).exists()), key=lambda p: p.name)
    for old in done[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


# ---- the run's writer --------------------------------------------------------------------------------
@dataclass
class Pending:
    """A save whose trainer shards may still be on their way to disk."""

    step: int
    tmp: Path
    trainer: Any  # TrainerGroup: ``checkpoint_written(wait)``
    state: str  # driver.json: the driver's state at ``step``, serialised at save time


class Checkpointer:
    """One run's ``step_N`` checkpoints: at most one trainer write in flight, committed only after it."""

    def __init__(self, run_dir: Path, keep: int, asynchronous: bool = True):
        self.checkpoints = Path(run_dir) / "checkpoints"
        self.keep, self.asynchronous = keep, asynchronous
        self.pending: Pending | None = None
        self.stall_s = 0.0  # seconds saves held the driver since the last ``take_stall``

    def save(self, step: int, trainer: Any, state: dict[str, Any]) -> None:
        """Start checkpoint ``step``: the previous one is committed first (waiting for its write), leftovers
        of a crashed save are deleted, then the trainer writes (in the background when asynchronous).
        ``state`` is serialised now: the loop changes its counts before the write commits. A write that
        fails here is dropped as ``poll`` drops one (``_commit_or_drop``)."""
        t0 = time.perf_counter()
        self._commit_or_drop(wait=True)
        clean_temp(self.checkpoints)
        tmp = temp_dir(step_dir(self.checkpoints.parent, step))
        try:
            tmp.mkdir(parents=True)
            trainer.save_checkpoint(str(tmp), self.asynchronous)
        except Exception as exc:  # noqa: BLE001 - as in _commit_or_drop
            _not_written(step, exc)
        else:
            self.pending = Pending(step, tmp, trainer, json.dumps({"step": step, **state}))
            if not self.asynchronous:
                self._commit_or_drop(wait=True)
        self.stall_s += time.perf_counter() - t0

    def commit(self, wait: bool) -> Path | None:
        """Publish the pending checkpoint if its shards are on disk (``wait``: block until they are). The
        manifest is written only once every other file is, so no incomplete checkpoint ever has one."""
        pending = self.pending
        if pending is None or not pending.trainer.checkpoint_written(wait):
            return None
        self.pending = None
        write_durable(pending.tmp / "driver.json", pending.state)
        write_durable(pending.tmp / MARKER, "")
        manifest.write(pending.tmp)
        final = step_dir(self.checkpoints.parent, pending.step)
        publish(pending.tmp, final)
        prune(self.checkpoints, self.keep)
        return final

    def poll(self) -> None:
        """Once per step: commit the pending checkpoint if its write finished (never blocks on it)."""
        self._commit_or_drop(wait=False)

    def finish(self) -> None:
        """End of the run: wait for the last write and commit it."""
        t0 = time.perf_counter()
        self._commit_or_drop(wait=True)
        self.stall_s += time.perf_counter() - t0

    def _commit_or_drop(self, wait: bool) -> None:
        """``commit``, where a write that failed (disk full, no permission) or a rank that died costs this
        checkpoint, not the run: one line is printed, the previous checkpoints stay as they were, the
        ``.tmp`` directory waits for the next save to delete it, and a dead rank is found by the next
        train step (which restarts from the previous checkpoint)."""
        pending = self.pending
        if pending is None:
            return
        try:
            self.commit(wait)
        except Exception as exc:  # noqa: BLE001 - any failure of the write: report it and go on
            self.pending = None
            _not_written(pending.step, exc)

    def take_stall(self) -> float:
        """Stall seconds since the last call (what ``checkpoint/stall_s`` reports), reset to 0."""
        stall, self.stall_s = self.stall_s, 0.0
        return stall


def _not_written(step: int, exc: Exception) -> None:
    cause = getattr(exc, "cause", None) or exc  # a rank's error arrives wrapped in RayTaskError
    first = (str(cause).strip().splitlines() or [""])[0]
    logger.warning(
        "relayrl: checkpoint step %d was not written (%s: %s); the earlier checkpoints stay as they were",
        step,
        type(cause).__name__,
        first,
    )
