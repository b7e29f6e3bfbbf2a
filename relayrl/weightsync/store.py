"""The ``pull`` backend's versioned store: each version written once to a directory, fetched and checked by readers.

Layout (a directory every reader can open: tmpfs on one host, NFS or a mounted bucket across hosts)::

    <root>/v<version>/payload.bin     the flat payload, exactly ``FlatLayout.nbytes`` bytes (layout.py)
    <root>/v<version>/manifest.json   version, layout digest, byte size, writer id, one checksum per tensor,
                                      and the layout itself, so a reader outside the transaction needs nothing else

Why it is shaped this way:

- Atomic publish: a version is written into ``<root>/.tmp-v<version>-*``, fsynced (payload, manifest, then the
  directory) and renamed to ``v<version>``, then the root is fsynced; a reader sees the whole version or none.
  Writing again a version that exists (a re-sync after a restart) swaps the new directory in.
- One file, not a file per bucket: the payload is written in layout order with one ``pwrite`` per tensor
  straight from the tensor's memory (no bucket buffer), so the store costs one copy, as ``shm`` does; one file
  is one open and one fsync. The checksums are kept per tensor, so an error names the tensor.
- The checksum guards against corruption (flipped bits, truncated or half-uploaded files), not forgery: the
  manifest sits unsigned beside the payload, so whoever can write one can write the other, and a cryptographic
  hash would buy nothing. xxh3-128 hashes at memory speed; sha256, blake2b and blake3 each cost more than
  writing the bytes (``bench/weight_sync.py`` prints all four on the model's size).
- Retention: after publishing v the store keeps v and the ``keep - 1`` highest versions below it; versions above
  v are stale (a trainer restarted from an older checkpoint publishes lower numbers again) and go. The version a
  reader is asked for is the one just published, so it is never the one retired. The oldest retired version's
  directory becomes the next draft and its payload is written over: a fresh file would cost as much again in
  page allocation and freeing as the write itself (tmpfs). A reader still reading it gets a checksum error, never
  wrong weights.
- Readers copy the payload into their own buffer and check every tensor there before returning it: the bytes
  checked are the bytes loaded, whatever happens to the store meanwhile, and a store that shrinks or fails
  mid-read raises an error (a mapping would take SIGBUS instead). Reads run on a few threads: page-cache reads
  run side by side (tmpfs writes do not, so the writer stays on one thread).

This module holds the layout, the manifest and the reading side; ``store_write.py`` the writing side (publish,
retention, private stores). No vLLM here: the trainer engine and the receiver that use them live in ``pull.py``.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash

from relayrl.weightsync.layout import Bucket, FlatLayout

HASH = "xxh3_128"
PAYLOAD = "payload.bin"
MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"
PRIVATE_PREFIX = "relayrl-pull-"
VERSION_DIR = re.compile(r"v(\d+)")
READ_THREADS = 4  # at most; one per core


@dataclass(frozen=True)
class Manifest:
    """What a reader checks before it trusts ``payload.bin``."""

    version: int
    digest: str  # FlatLayout.digest of the layout below
    nbytes: int  # payload.bin's size
    writer: str  # the publishing StoreWriter's id: two trainers on one store are caught, not mixed
    checksums: list[str]  # HASH of each tensor's bytes, in layout order
    layout: dict[str, Any]  # FlatLayout.to_dict()
    hash: str = HASH

    def dumps(self) -> str:
        return json.dumps(vars(self))  # not asdict: it deep-copies the layout, which costs ms per thousand tensors

    @classmethod
    def loads(cls, text: str) -> Manifest:
        return cls(**json.loads(text))


def checksum(data: Any) -> str:
    """``HASH`` of a bytes-like ``data``."""
    return xxhash.xxh3_128_hexdigest(data)


def version_dirs(root: Path) -> dict[int, Path]:
    """``{version: directory}`` of the published versions under ``root``."""
    return {int(m[1]): p for p in root.iterdir() if (m := VERSION_DIR.fullmatch(p.name)) and p.is_dir()}


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fetch(root: Path, version: int, layout: FlatLayout, writer: str, out: torch.Tensor) -> Manifest:
    """Read ``v<version>`` into ``out`` (uint8, ``layout.nbytes``) and check it: the manifest's version, writer,
    layout digest and size, then every tensor's checksum. Raises one line naming the cause; on return every byte
    of ``out`` that ``layout`` uses is the one published."""
    vdir = open_version(root, version)
    try:
        manifest = read_manifest(vdir, root, version)
        check_manifest(manifest, version, layout, writer)
        read_checked(vdir, manifest, layout, out)
    finally:
        os.close(vdir)
    return manifest


class FetchError(RuntimeError):
    """An engine could not fetch a version it was asked to serve (``weightsync.pull_when=admission``): it keeps
    its previous weights and version, and the call that asked is handed back (``controller/scheduler.py``)."""


def fetch_error(error: BaseException) -> FetchError | None:
    """The ``FetchError`` a remote call (a ``RayTaskError``) ended with, if that is what it ended with."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, FetchError) else None


def newest_version(root: Path, at_least: int) -> int:
    """The newest version published under ``root``, which must be ``at_least`` (the one a call needs)."""
    check_reachable(root)
    have = version_dirs(root)
    if not have or max(have) < at_least:
        raise FileNotFoundError(
            f"pull store {root} holds {sorted(have) or 'no version'}, none at or above v{at_least}; "
            "the trainer did not publish it there"
        )
    return max(have)


def newer(root: Path, version: int) -> bool:
    """``root`` now holds a version above ``version`` (-1: none was tried); False if the store itself is gone."""
    try:
        return version >= 0 and max(version_dirs(root), default=-1) > version
    except OSError:
        return False


def check_reachable(root: Path) -> None:
    if not root.is_dir():
        raise FileNotFoundError(
            f"pull store {root} is unreachable from this engine (no such directory); "
            "mount it here or set weightsync.pull_dir to a path this host sees"
        )


def open_version(root: Path, version: int) -> int:
    """A descriptor of ``v<version>``'s directory: manifest and payload are then read from the same one."""
    check_reachable(root)
    try:
        return os.open(root / f"v{version}", os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        have = sorted(version_dirs(root))
        raise FileNotFoundError(
            f"pull store {root} has no v{version} (it holds {have or 'no version'}); the trainer did not publish it"
        ) from None


def read_manifest(vdir: int, root: Path, version: int) -> Manifest:
    try:
        with open(MANIFEST, opener=lambda name, flags: os.open(name, flags, dir_fd=vdir)) as f:
            return Manifest.loads(f.read())
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"pull v{version}: {root}/v{version}/{MANIFEST} is unreadable ({exc})") from None


def check_manifest(m: Manifest, version: int, layout: FlatLayout, writer: str) -> None:
    """The manifest describes the version, layout and size this reader expects, from its own trainer."""
    where = f"pull v{version}: the manifest"
    if m.version != version:
        raise ValueError(f"{where} says v{m.version}; the store is damaged")
    if m.writer != writer:
        raise ValueError(
            f"{where} was written by another trainer ({m.writer}, expected {writer}); give each run its own "
            "weightsync.pull_dir"
        )
    if m.digest != layout.digest:  # m.layout is for readers outside the transaction; this one holds its own
        raise ValueError(f"{where} has layout {m.digest}, expected {layout.digest}; re-initialise the transfer")
    if (m.nbytes, m.hash, len(m.checksums)) != (layout.nbytes, HASH, len(layout.slots)):
        raise ValueError(
            f"{where} says {m.nbytes} bytes, {len(m.checksums)} {m.hash} checksums; expected {layout.nbytes} bytes, "
            f"{len(layout.slots)} {HASH} checksums"
        )


def read_checked(vdir: int, manifest: Manifest, layout: FlatLayout, out: torch.Tensor) -> None:
    """Read ``payload.bin`` into ``out`` bucket by bucket, a few buckets at a time, checking every tensor."""
    fd = os.open(PAYLOAD, os.O_RDONLY, dir_fd=vdir)
    try:
        if (size := os.fstat(fd).st_size) != manifest.nbytes:
            raise ValueError(
                f"pull v{manifest.version}: {PAYLOAD} is {size} bytes, the manifest says {manifest.nbytes} "
                "(truncated or overwritten); the store's copy is damaged"
            )
        data = out.numpy().data  # a memoryview of the buffer
        threads = min(READ_THREADS, len(os.sched_getaffinity(0)), len(layout.buckets))
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda b: read_bucket(fd, data, layout, b, manifest), layout.buckets))
    finally:
        os.close(fd)


def read_bucket(fd: int, data: memoryview, layout: FlatLayout, bucket: Bucket, manifest: Manifest) -> None:
    offset, view = bucket.start, data[bucket.start : bucket.end]
    while view:
        if (got := os.preadv(fd, [view], offset)) == 0:
            raise ValueError(f"pull v{manifest.version}: {PAYLOAD} ended at byte {offset} while being read")
        view, offset = view[got:], offset + got
    for i in range(bucket.first, bucket.last):
        slot = layout.slots[i]
        if checksum(data[slot.offset : slot.offset + slot.nbytes]) != manifest.checksums[i]:
            raise ValueError(
                f"pull v{manifest.version}: {slot.name} (bytes {slot.offset}..{slot.offset + slot.nbytes}) fails "
                f"its {HASH} checksum; the store's copy is corrupt"
            )
