"""The writing side of the ``pull`` store (``store.py`` has its layout and why it is shaped so): a writer that
publishes versions atomically and retires old ones, the draft a version is written into (by rank 0 alone, or by
each pipeline stage for its own part), and the private stores a trainer makes for itself."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from relayrl.weightsync.layout import FlatLayout, Slot, to_dtype
from relayrl.weightsync.store import (
    MANIFEST,
    PAYLOAD,
    PRIVATE_PREFIX,
    TMP_PREFIX,
    Manifest,
    checksum,
    fsync_dir,
    version_dirs,
)


class StoreWriter:
    """The trainer's end: publishes versions into ``root`` and retires old ones. One writer per root."""

    def __init__(self, root: Path, keep: int, private: bool = False) -> None:
        self.root, self.keep, self.private = root, keep, private
        self.writer = uuid.uuid4().hex[:16]
        for stale in root.glob(f"{TMP_PREFIX}*"):  # drafts a killed writer left behind
            shutil.rmtree(stale, ignore_errors=True)

    @classmethod
    def open(cls, pull_dir: str, keep: int) -> StoreWriter:
        """The store at ``pull_dir`` (must exist), or with ``pull_dir=""`` a new private one (``private_root``)."""
        if not pull_dir:
            return cls(private_root(), keep, private=True)
        if not Path(pull_dir).is_dir():
            raise FileNotFoundError(
                f"weightsync.pull_dir={pull_dir} is not a directory; create it (on a path every engine's host mounts)"
            )
        return cls(Path(pull_dir), keep)

    @contextlib.contextmanager
    def draft(self, version: int, nbytes: int) -> Iterator[Draft]:
        """A version being written: published by ``Draft.publish``, removed if the block raises before that."""
        tmp = self.reuse(version) or Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}v{version}-", dir=self.root))
        draft = Draft(self, version, tmp, nbytes)
        try:
            yield draft
        finally:
            draft.close()
            shutil.rmtree(tmp, ignore_errors=True)  # gone by now once published

    def kept(self, published: int) -> set[int]:
        """The versions left after publishing ``published``: it and the ``keep - 1`` highest below it."""
        below = sorted((v for v in version_dirs(self.root) if v < published), reverse=True)
        return {published, *below[: self.keep - 1]}

    def reuse(self, version: int) -> Path | None:
        """The oldest version publishing ``version`` retires, renamed to a draft (readers see it go whole); None
        if there is none, or it is not a directory of this user's (a shared store may hold anything)."""
        kept = self.kept(version)
        for old, path in sorted(version_dirs(self.root).items()):
            info = os.lstat(path)
            if old not in kept and stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
                tmp = self.root / f"{TMP_PREFIX}v{version}-{uuid.uuid4().hex[:8]}"
                os.rename(path, tmp)
                (tmp / MANIFEST).unlink(missing_ok=True)
                return tmp
        return None

    def install(self, tmp: Path, version: int) -> None:
        """Rename the finished ``tmp`` to ``v<version>`` (swapping out one that exists), then retire the rest."""
        target = self.root / f"v{version}"
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}old-v{version}-", dir=self.root))
            os.replace(target, old / target.name)
        os.rename(tmp, target)
        fsync_dir(self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        kept = self.kept(version)
        for v, path in version_dirs(self.root).items():
            if v not in kept:
                shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        """A private store goes with its writer; a shared one keeps its last versions for readers."""
        if self.private:
            shutil.rmtree(self.root, ignore_errors=True)


class Draft:
    """``payload.bin`` of one version, open for writing (``write_payload``, or ``write_slots`` from other
    processes), then ``publish``."""

    def __init__(self, store: StoreWriter, version: int, tmp: Path, nbytes: int) -> None:
        self.store, self.version, self.tmp, self.nbytes = store, version, tmp, nbytes
        self.fd: int | None = os.open(tmp / PAYLOAD, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        os.ftruncate(self.fd, nbytes)

    def publish(self, layout: dict[str, Any], digest: str, checksums: list[str]) -> Manifest:
        """fsync the payload, write the manifest, fsync, and rename the draft into place. ``layout`` is
        ``FlatLayout.to_dict()`` (made once per layout by the caller: it is large for large models)."""
        assert self.fd is not None, "a draft is published once"
        os.fsync(self.fd)
        self.close()
        manifest = Manifest(self.version, digest, self.nbytes, self.store.writer, checksums, layout)
        fd = os.open(self.tmp / MANIFEST, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(manifest.dumps())
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.tmp)
        self.store.install(self.tmp, self.version)
        return manifest

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def write_payload(draft: Draft, layout: FlatLayout, named: Iterator[tuple[str, torch.Tensor]]) -> list[str]:
    """Write every tensor ``named`` yields (the layout's, in order; checked against it) into ``draft`` in the
    layout's dtype, one ``pwrite`` per tensor from its own memory; return each tensor's checksum."""
    assert draft.fd is not None, "a draft is written before it is published"
    checksums = []
    for i, slot in enumerate(layout.slots):
        name, tensor = next(named)
        layout.check(name, tensor, i)
        checksums.append(write_slot(draft.fd, slot, tensor))
    return checksums


def write_slots(path: str, layout: FlatLayout, named: Iterator[tuple[str, torch.Tensor]]) -> dict[int, str]:
    """Write the tensors ``named`` yields (any of the layout's, by name; each checked against its slot) into the
    payload file at ``path`` that another process's draft created: a pipeline stage writing its own part. The
    bytes are fsynced before it returns (the draft's own fsync covers only its host's writes on a shared
    filesystem). Returns each written slot's index -> checksum."""
    index = {slot.name: i for i, slot in enumerate(layout.slots)}
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        checksums = {}
        for name, tensor in named:
            i = index[name]
            layout.check(name, tensor, i)
            checksums[i] = write_slot(fd, layout.slots[i], tensor)
        os.fsync(fd)
        return checksums
    finally:
        os.close(fd)


def write_slot(fd: int, slot: Slot, tensor: torch.Tensor) -> str:
    """``tensor`` in ``slot``'s dtype at its offset of the payload open as ``fd``; returns its checksum."""
    data = raw_bytes(tensor.detach().to(device="cpu", dtype=to_dtype(slot.dtype)))
    pwrite_all(fd, data, slot.offset)
    return checksum(data)


def pwrite_all(fd: int, data: Any, offset: int) -> None:
    """Write a bytes-like ``data`` at ``offset`` of ``fd``, all of it."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def raw_bytes(tensor: torch.Tensor) -> Any:
    """The tensor's bytes as a uint8 numpy array (a view when it is contiguous; any dtype, bf16 included)."""
    return tensor.contiguous().view(-1).view(torch.uint8).numpy()


def private_root(base: Path | None = None) -> Path:
    """A new directory only this user can read, in ``base``: by default /dev/shm (memory), else the system's temp
    dir. Its name holds this process's id, so the directories of writers that died without closing go here."""
    if base is None:
        base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    for path in base.glob(f"{PRIVATE_PREFIX}*"):
        if is_orphan(path):
            shutil.rmtree(path, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-", dir=base))


def is_orphan(path: Path) -> bool:
    """A private store of this user whose writer process is gone."""
    pid = path.name.removeprefix(PRIVATE_PREFIX).split("-")[0]
    if not pid.isdigit() or path.is_symlink() or path.stat().st_uid != os.getuid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False
