"""Build a model directory once, atomically, even when several processes ask at the same time.

Why: tests, rollout actors and trainer ranks may all ask for the same model at start-up. Each build
writes into ``<out>.tmp`` and renames it to ``<out>`` (a rename within one filesystem is atomic), so a
reader either sees no directory or a complete one. An exclusive ``fcntl`` lock on ``<out>.lock`` makes
the second caller wait for the first and then find the finished directory instead of building again.
Under the lock any ``<out>.tmp`` left behind is from a crashed build, so it is removed.
An existing but incomplete ``<out>`` is reported, not deleted: it may be a user's directory.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

REQUIRED_FILES = ("config.json", "model.safetensors")


def is_complete(model_dir: Path) -> bool:
    """A finished build: the files every loader (transformers, vLLM) needs are present."""
    return all((model_dir / name).is_file() for name in REQUIRED_FILES)


def build_once(out: Path, write: Callable[[Path], object]) -> Path:
    """Return ``out``, calling ``write(tmp_dir)`` to create it first if it is not complete yet."""
    out = Path(out)
    if is_complete(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if is_complete(out):  # another process finished while we waited
            return out
        if out.exists():  # not ours to delete: it may hold someone's files
            raise FileExistsError(
                f"{out} exists but holds no complete model ({', '.join(REQUIRED_FILES)}); "
                f"delete it or choose another directory"
            )
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)  # under the lock, a leftover tmp is from a crashed build
        tmp.mkdir()
        write(tmp)
        if not is_complete(tmp):
            raise RuntimeError(f"model build into {tmp} wrote no {' / '.join(REQUIRED_FILES)}; see the log above")
        tmp.rename(out)
    return out


def models_dir(cache_dir: str | Path | None = None) -> Path:
    """Where built-in models are kept: ``<root>/models``, root = ``cache_dir`` or env ``RELAYRL_CACHE``
    or ``~/.cache/relayrl`` (first one set wins)."""
    root = cache_dir or os.environ.get("RELAYRL_CACHE") or Path.home() / ".cache" / "relayrl"
    return Path(root).expanduser() / "models"
