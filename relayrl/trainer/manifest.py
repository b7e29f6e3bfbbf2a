"""Whether a checkpoint directory may be loaded: written by this user and unchanged since.

Loading a torch DCP checkpoint unpickles ``dcp/.metadata`` (``pickle.load``) and every non-tensor entry
(``torch.load(weights_only=False)``), so whoever can change those files can run code in the trainer.
``write`` runs once every file of a checkpoint is complete and records each file's size and sha256 in
``manifest.json``; ``verify`` runs before anything of a checkpoint is read and refuses it unless

- the directory and everything in it are owned by this user, are not group- or world-writable, and
  are plain directories and regular files (no symbolic link, no device or fifo);
- its files are exactly those the manifest lists, with the listed sizes and digests.

That stops another user, a corrupted disk and a partial write. It does not stop someone who runs as
the same user: they can rewrite the manifest too (docs/checkpoints.md). Checking costs one read of the
checkpoint. No torch here: the driver checks checkpoints before Ray (and torch) start.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import NoReturn

MANIFEST = "manifest.json"
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class UntrustedCheckpoint(Exception):
    """A checkpoint refused before anything in it was read. The message is one line: path, cause, fix."""


def write(root: Path) -> None:
    """Record every file under ``root`` (but the manifest) in ``root/manifest.json``, then take group and
    other write permission off everything: a umask of 002 leaves them on, and ``verify`` refuses them."""
    files = {rel: {"size": _size(path), "sha256": _sha256(path)} for rel, path in _files(root)}
    (root / MANIFEST).write_text(json.dumps({"files": files}, indent=1, sort_keys=True) + "\n")
    _drop_others_write(root)


def verify(root: Path) -> None:
    """Raise ``UntrustedCheckpoint`` unless ``root`` is this user's and matches its manifest. Reads the
    manifest (JSON) and hashes the files; unpickles nothing."""
    root = Path(root)
    _check_owned(root, root)
    listed = _read_manifest(root)
    found = dict(_files(root))
    for rel in sorted(listed.keys() - found.keys()):
        _refuse(root, f"{rel} is listed in {MANIFEST} but missing", "resume from an earlier checkpoint")
    for rel in sorted(found.keys() - listed.keys()):
        _refuse(root, f"{rel} is not listed in {MANIFEST}", "resume from an earlier checkpoint")
    for key, measure in (("size", _size), ("sha256", _sha256)):  # every size before any digest
        for rel, path in found.items():
            if measure(path) != listed[rel][key]:
                _refuse(
                    root,
                    f"{rel} does not match its {key} in {MANIFEST}: it was corrupted or changed after the save",
                    "resume from an earlier checkpoint",
                )


def _files(root: Path) -> list[tuple[str, Path]]:
    """``(path relative to root, path)`` of every file under ``root`` but the manifest, sorted."""
    out = []
    for dirpath, _, names in os.walk(root):
        out += [(Path(dirpath, n).relative_to(root).as_posix(), Path(dirpath, n)) for n in names]
    return sorted(x for x in out if x[0] != MANIFEST)


def _drop_others_write(root: Path) -> None:
    for dirpath, _, names in os.walk(root):
        for path in [Path(dirpath)] + [Path(dirpath, n) for n in names]:
            mode = path.lstat().st_mode
            if mode & OTHERS_WRITE:
                path.chmod(stat.S_IMODE(mode) & ~OTHERS_WRITE)


def _check_owned(root: Path, path: Path) -> None:
    """Refuse ``path`` (and, for a directory, everything under it) unless it is this user's own plain
    directory or regular file that nobody else may write. ``lstat``: a link is judged, not followed."""
    st, rel = path.lstat(), ("it" if path == root else path.relative_to(root).as_posix())
    if stat.S_ISLNK(st.st_mode) or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        _refuse(root, f"{rel} is {kind}", "a checkpoint holds only its own files; resume from another one")
    if st.st_uid != os.geteuid():
        _refuse(
            root,
            f"{rel} is owned by uid {st.st_uid}, not this user (uid {os.geteuid()})",
            "resume only from checkpoints you wrote (or copy this one and chmod -R go-w the copy, "
            "if you trust whoever wrote it)",
        )
    if st.st_mode & OTHERS_WRITE:
        _refuse(
            root,
            f"{rel} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o}), so others could have changed it",
            f"chmod -R go-w {root} if you trust its contents",
        )
    if stat.S_ISDIR(st.st_mode):
        for child in sorted(path.iterdir()):
            _check_owned(root, child)


def _read_manifest(root: Path) -> dict[str, dict]:
    """The manifest's ``{path: {"size", "sha256"}}``; a missing or malformed manifest is refused."""
    path = root / MANIFEST
    if not path.exists():
        _refuse(
            root,
            f"it has no {MANIFEST} (written last at save: the save did not finish, or a relayrl "
            "without manifests wrote it)",
            "resume from another checkpoint or start fresh",
        )
    try:
        files = json.loads(path.read_text())["files"]
        well_formed = all(isinstance(e["size"], int) and isinstance(e["sha256"], str) for e in files.values())
    except (ValueError, KeyError, TypeError, AttributeError):
        well_formed = False
    if not well_formed:
        _refuse(root, f"its {MANIFEST} is malformed", "resume from another checkpoint or start fresh")
    return files


def _size(path: Path) -> int:
    return path.stat().st_size


def _sha256(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with open(fd, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _refuse(root: Path, cause: str, fix: str) -> NoReturn:
    raise UntrustedCheckpoint(f"checkpoint {root} refused: {cause}; {fix}")
