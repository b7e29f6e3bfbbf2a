"""The ``pull`` backend's versioned store, without vLLM: publish, read, every check a reader makes, retention and
atomic publishing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relayrl.config import ConfigError, WeightSyncConfig
from relayrl.weightsync.layout import FlatLayout
from relayrl.weightsync.store import (
    MANIFEST,
    PAYLOAD,
    PRIVATE_PREFIX,
    FetchError,
    Manifest,
    fetch,
    fetch_error,
    newer,
    newest_version,
    open_version,
    read_checked,
    read_manifest,
)
from relayrl.weightsync.store_write import StoreWriter, private_root, write_payload

BUCKET_BYTES = 4096


@pytest.fixture
def weights() -> dict[str, torch.Tensor]:
    """Odd sizes (alignment gaps inside and between buckets), a bf16 tensor and one over a bucket."""
    gen = torch.Generator().manual_seed(0)
    sd = {f"w{i}": torch.randn(37 + i, 5, generator=gen) for i in range(6)}
    sd["big"] = torch.randn(2000, generator=gen)  # 8000 bytes: a bucket of its own
    sd["half"] = torch.randn(9, generator=gen).to(torch.bfloat16)
    return sd


@pytest.fixture
def layout(weights) -> FlatLayout:
    return FlatLayout.plan(((n, t.dtype, tuple(t.shape)) for n, t in weights.items()), BUCKET_BYTES)


def publish(store: StoreWriter, layout: FlatLayout, weights: dict[str, torch.Tensor], version: int) -> Manifest:
    with store.draft(version, layout.nbytes) as draft:
        return draft.publish(layout.to_dict(), layout.digest, write_payload(draft, layout, iter(weights.items())))


def read(root: Path, version: int, layout: FlatLayout, writer: str) -> dict[str, torch.Tensor]:
    out = torch.zeros(layout.nbytes, dtype=torch.uint8)
    fetch(root, version, layout, writer, out)
    return dict(layout.views(out))


def test_a_published_version_reads_back_bit_for_bit(tmp_path, weights, layout):
    store = StoreWriter.open(str(tmp_path), keep=2)
    manifest = publish(store, layout, weights, 3)
    assert sorted(p.name for p in (tmp_path / "v3").iterdir()) == [MANIFEST, PAYLOAD]
    assert (tmp_path / "v3" / PAYLOAD).stat().st_size == layout.nbytes
    on_disk = json.loads((tmp_path / "v3" / MANIFEST).read_text())
    assert on_disk["version"] == 3 and on_disk["digest"] == layout.digest and on_disk["nbytes"] == layout.nbytes
    assert on_disk["hash"] == "xxh3_128" and len(on_disk["checksums"]) == len(layout.slots)
    assert len(layout.buckets) > 2
    assert FlatLayout.from_dict(on_disk["layout"]) == layout  # enough for a reader outside the transaction
    assert Manifest.loads((tmp_path / "v3" / MANIFEST).read_text()) == manifest
    got = read(tmp_path, 3, layout, store.writer)
    assert all(torch.equal(got[n], t) for n, t in weights.items())
    assert (tmp_path / "v3" / PAYLOAD).stat().st_mode & 0o777 == 0o600


def flip_a_byte(vdir: Path) -> None:
    with open(vdir / PAYLOAD, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x01]))


def edit_manifest(vdir: Path, **fields) -> None:
    path = vdir / MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


DAMAGE = {
    "flipped byte": (flip_a_byte, r"pull v1: w0 \(bytes 0\.\.740\) fails its xxh3_128 checksum; .* corrupt"),
    "truncated": (lambda d: os.truncate(d / PAYLOAD, 1000), r"pull v1: payload.bin is 1000 bytes, the manifest says"),
    "wrong digest": (lambda d: edit_manifest(d, digest="0" * 16), r"the manifest has layout 0{16}, expected"),
    "wrong version": (lambda d: edit_manifest(d, version=7), r"pull v1: the manifest says v7"),
    "other writer": (lambda d: edit_manifest(d, writer="x"), r"written by another trainer .*own weightsync.pull_dir"),
    "no manifest": (lambda d: (d / MANIFEST).unlink(), r"pull v1: .*/v1/manifest.json is unreadable"),
    "bad manifest": (lambda d: (d / MANIFEST).write_text("{"), r"manifest.json is unreadable"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_version_is_refused_in_one_line_naming_the_cause(tmp_path, weights, layout, damage):
    store = StoreWriter.open(str(tmp_path), keep=2)
    publish(store, layout, weights, 1)
    harm, message = DAMAGE[damage]
    harm(tmp_path / "v1")
    with pytest.raises(ValueError, match=message) as err:
        read(tmp_path, 1, layout, store.writer)
    assert "\n" not in str(err.value)


def test_a_missing_store_or_version_is_refused_in_one_line(tmp_path, weights, layout):
    store = StoreWriter.open(str(tmp_path), keep=2)
    publish(store, layout, weights, 1)
    with pytest.raises(FileNotFoundError, match=r"pull store .* has no v2 \(it holds \[1\]\)"):
        read(tmp_path, 2, layout, store.writer)
    with pytest.raises(FileNotFoundError, match=r"pull store .*gone is unreachable from this engine"):
        read(tmp_path / "gone", 1, layout, store.writer)


def test_a_layout_the_reader_does_not_hold_is_refused(tmp_path, weights, layout):
    store = StoreWriter.open(str(tmp_path), keep=2)
    publish(store, layout, weights, 1)
    other = FlatLayout.plan(((n, t.dtype, tuple(t.shape)) for n, t in weights.items()), BUCKET_BYTES * 2)
    with pytest.raises(ValueError, match=f"has layout {layout.digest}, expected {other.digest}"):
        read(tmp_path, 1, other, store.writer)


def versions(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_retention_keeps_the_newest_and_drops_versions_above_a_republished_one(tmp_path, weights, layout):
    store = StoreWriter.open(str(tmp_path), keep=2)
    for version in (1, 2, 3, 4):
        publish(store, layout, weights, version)
    assert versions(tmp_path) == ["v3", "v4"]
    publish(store, layout, weights, 2)  # a trainer restarted from an older checkpoint: 3 and 4 are stale
    assert versions(tmp_path) == ["v2"]
    store = StoreWriter.open(str(tmp_path), keep=1)  # only the version just published
    publish(store, layout, weights, 5)
    assert versions(tmp_path) == ["v5"]


def test_a_version_written_again_is_swapped_in_whole(tmp_path, weights, layout):
    store = StoreWriter.open(str(tmp_path), keep=2)
    publish(store, layout, weights, 1)
    changed = {n: t + 1 for n, t in weights.items()}
    publish(store, layout, changed, 1)
    assert versions(tmp_path) == ["v1"]
    got = read(tmp_path, 1, layout, store.writer)
    assert all(torch.equal(got[n], t) for n, t in changed.items())


def test_a_retired_version_is_written_over_and_a_reader_still_on_it_is_refused(tmp_path, weights, layout):
    """Publishing v3 with keep=2 retires v1 and writes v3 into v1's payload file (no fresh pages). A reader that
    opened v1 before gets a checksum error for it, never v3's bytes as v1; v2, kept, reads as it was."""
    store = StoreWriter.open(str(tmp_path), keep=2)
    publish(store, layout, weights, 1)
    publish(store, layout, {n: t + 2 for n, t in weights.items()}, 2)
    inode = (tmp_path / "v1" / PAYLOAD).stat().st_ino
    vdir = open_version(tmp_path, 1)
    try:
        manifest = read_manifest(vdir, tmp_path, 1)
        changed = {n: t + 3 for n, t in weights.items()}
        publish(store, layout, changed, 3)
        assert versions(tmp_path) == ["v2", "v3"] and (tmp_path / "v3" / PAYLOAD).stat().st_ino == inode
        with pytest.raises(ValueError, match=r"pull v1: w0 .* fails its xxh3_128 checksum"):
            read_checked(vdir, manifest, layout, torch.zeros(layout.nbytes, dtype=torch.uint8))
    finally:
        os.close(vdir)
    assert all(torch.equal(read(tmp_path, 3, layout, store.writer)[n], t) for n, t in changed.items())
    assert all(torch.equal(read(tmp_path, 2, layout, store.writer)[n], t + 2) for n, t in weights.items())


class Interrupted(Exception):
    pass


def test_a_write_that_fails_midway_publishes_nothing(tmp_path, weights, layout):
    """Readers see a whole version or none: a writer that raises mid-payload leaves no ``v<N>`` and no draft, and
    one killed mid-payload (its draft left behind) leaves a draft the next writer removes, never a version."""
    store = StoreWriter.open(str(tmp_path), keep=2)

    def failing():
        yield from list(weights.items())[:3]
        raise Interrupted

    with pytest.raises(Interrupted), store.draft(1, layout.nbytes) as draft:
        write_payload(draft, layout, failing())
    assert versions(tmp_path) == []
    entered = store.draft(2, layout.nbytes)  # entered, never left: what a SIGKILL leaves
    write_payload(entered.__enter__(), layout, iter(weights.items()))
    assert [p.name.startswith(".tmp-v2-") for p in tmp_path.iterdir()] == [True]
    with pytest.raises(FileNotFoundError, match="has no v2"):
        read(tmp_path, 2, layout, store.writer)
    StoreWriter.open(str(tmp_path), keep=2)
    assert versions(tmp_path) == []


def test_a_layout_mismatch_from_the_trainer_is_caught_while_writing(tmp_path, weights, layout):
    store = StoreWriter.open(str(tmp_path), keep=2)
    renamed = {("x" if n == "w2" else n): t for n, t in weights.items()}
    with pytest.raises(ValueError, match=r"weight 2 is 'x'"), store.draft(1, layout.nbytes) as draft:
        write_payload(draft, layout, iter(renamed.items()))
    assert versions(tmp_path) == []


def test_a_private_store_is_made_per_writer_and_removed_with_it():
    store = StoreWriter.open("", keep=2)
    assert store.root.name.startswith(f"{PRIVATE_PREFIX}{os.getpid()}-") and store.root.stat().st_mode & 0o077 == 0
    store.close()
    assert not store.root.exists()


def test_a_private_store_whose_writer_died_is_removed_by_the_next_one(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f"{PRIVATE_PREFIX}{dead.stdout.strip()}-abc"
    alive = tmp_path / f"{PRIVATE_PREFIX}{os.getpid()}-abc"
    orphan.mkdir()
    alive.mkdir()
    assert private_root(tmp_path).parent == tmp_path
    assert not orphan.exists() and alive.exists()


def test_a_shared_store_must_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"weightsync.pull_dir=.*nope is not a directory; create it"):
        StoreWriter.open(str(tmp_path / "nope"), keep=2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"pull_dir": "store"}, r"weightsync.pull_dir=store is relative, .* pass an absolute path"),
        ({"pull_keep": 0}, r"weightsync.pull_keep=0 must be > 0"),
    ],
)
def test_config_errors_are_one_line_naming_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        WeightSyncConfig(backend="pull", **kwargs)


def test_the_store_imports_no_vllm():
    """Readers outside the transaction (and these tests) need only torch and xxhash."""
    code = "import sys, relayrl.weightsync.store; sys.exit('vllm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_newest_version_is_what_a_replica_fetching_on_admission_reads(tmp_path):
    """``pull_when=admission``: a replica needing v2 reads the newest published version, v3 here (drafts and
    stray names are not versions); none at or above what it needs is one line naming what the store holds.
    ``newer`` tells a fetch whose version was retired meanwhile that a later one is there to try."""
    for name in ("v1", "v2", "v3", ".tmp-v4-abc", "notes"):
        (tmp_path / name).mkdir()
    assert newest_version(tmp_path, 2) == 3 and newest_version(tmp_path, 3) == 3
    with pytest.raises(FileNotFoundError, match=r"holds \[1, 2, 3\], none at or above v4") as err:
        newest_version(tmp_path, 4)
    assert "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="is unreachable from this engine"):
        newest_version(tmp_path / "unmounted", 1)
    assert newer(tmp_path, 2) and not newer(tmp_path, 3) and not newer(tmp_path, -1)
    assert not newer(tmp_path / "unmounted", 1)


class TaskError(Exception):
    """Ray's ``RayTaskError`` as ``fetch_error`` reads it: the remote call's own exception as ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def test_fetch_error_reads_the_cause_a_remote_call_ended_with():
    """The scheduler and the probe tell a replica's failed fetch from any other task error by its cause."""
    failed = FetchError("could not fetch v3 or newer: pull store /x is unreachable from this engine")
    assert fetch_error(TaskError(failed)) is failed
    assert fetch_error(TaskError(ValueError("calculator env: cannot parse"))) is None
    assert fetch_error(RuntimeError("no cause")) is None
