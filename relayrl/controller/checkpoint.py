"""Run checkpoints: trainer shards (DCP) + the driver's state, written atomically, found by ``resume``.

Layout under the run directory::

    checkpoints/step_000040/
        dcp/                 trainer model + optimizer shards (torch Distributed Checkpoint)
        rng-rank<r>.pt       each rank's RNG state (tensors only)
        driver.json          step, sampler cursor, prompts started but not yet trained (re-issued first)
        COMPLETE             written last

Everything is written into ``.step_000040.tmp`` and renamed only after ``COMPLETE`` is on disk, so a
crash while saving never leaves a directory that looks complete: ``latest`` only accepts complete ones.
In async mode the batches in flight at save time are not kept (they hold refs into a dead cluster);
their prompts are, and are generated again after resuming, under the restored weights.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

MARKER = "COMPLETE"


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def latest(run_dir: Path) -> Path | None:
    """The complete checkpoint with the highest step in ``run_dir`` (None if there is none)."""
    done = [p for p in (Path(run_dir) / "checkpoints").glob("step_*") if (p / MARKER).exists()]
    return max(done, key=lambda p: int(p.name.removeprefix("step_")), default=None)


def find_resume(output_dir: str, name: str, resume: str) -> tuple[Path, Path] | None:
    """``(run_dir, checkpoint)`` to resume from: ``resume=auto`` takes the newest run named ``name`` under
    ``output_dir`` that has a complete checkpoint (None: start fresh); otherwise ``resume`` is a path to a
    checkpoint directory or to a run directory."""
    if resume == "auto":
        runs = sorted(Path(output_dir).glob(f"{name}-*"), key=lambda p: p.stat().st_mtime, reverse=True)
        for run in runs:
            if (ckpt := latest(run)) is not None:
                return run, ckpt
        return None
    path = Path(resume)
    if (path / MARKER).exists():
        return path.parent.parent, path
    if (ckpt := latest(path)) is not None:
        return path, ckpt
    raise FileNotFoundError(f"run.resume={resume} holds no complete checkpoint; point it at "
                            "runs/<id> or runs/<id>/checkpoints/step_N, or use run.resume=auto")


def save(run_dir: Path, step: int, trainer: Any, driver_state: dict[str, Any], keep: int) -> Path:
    """Write checkpoint ``step`` atomically, then keep only the newest ``keep`` complete ones."""
    final = step_dir(run_dir, step)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainer.save_checkpoint(str(tmp))
    (tmp / "driver.json").write_text(json.dumps({"step": step, **driver_state}))
    (tmp / MARKER).write_text("")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    done = sorted((p for p in final.parent.glob("step_*") if (p / MARKER).exists()), key=lambda p: p.name)
    for old in done[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def driver_state(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / "driver.json").read_text())
