"""A checkpoint is loaded only if this user wrote it and nothing in it changed (``trainer.manifest``):
every refusal comes before DCP unpickles anything, in one line that names the path."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from relayrl.trainer import manifest
from relayrl.trainer.checkpoint import Parts, load, save
from relayrl.trainer.manifest import MANIFEST, UntrustedCheckpoint


def _parts(seed: int) -> Parts:
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    return {"policy": (model, torch.optim.AdamW(model.parameters(), lr=1e-2))}


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A real single-rank checkpoint, committed as the driver commits one (manifest written last)."""
    path = tmp_path / "step_000002"
    save(path, _parts(0), rank=0)
    (path / "driver.json").write_text('{"step": 2}')
    manifest.write(path)
    return path


@pytest.fixture
def no_dcp_load(monkeypatch):
    """Fails the test if DCP is asked to read (and so unpickle) anything."""

    def forbidden(*args, **kwargs):
        raise AssertionError("dcp.load was called on a checkpoint that should have been refused")

    monkeypatch.setattr(dcp, "load", forbidden)


def _refused(path: Path, match: str) -> str:
    with pytest.raises(UntrustedCheckpoint, match=match) as err:
        load(path, _parts(1), rank=0)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    return str(err.value)


def test_round_trip_loads_exactly_what_was_saved(ckpt):
    fresh = _parts(1)
    load(ckpt, fresh, rank=0)
    saved, restored = _parts(0)["policy"][0], fresh["policy"][0]
    assert all(torch.equal(a, b) for a, b in zip(saved.parameters(), restored.parameters()))
    files = sorted(manifest._files(ckpt))
    assert [rel for rel, _ in files] == ["dcp/.metadata", "dcp/__0_0.distcp", "driver.json", "rng-rank0.pt"]


def test_write_takes_group_write_off_so_a_umask_002_save_verifies(tmp_path):
    old = os.umask(0o002)
    try:
        path = tmp_path / "ckpt"
        save(path, _parts(0), rank=0)
    finally:
        os.umask(old)
    assert (path / "rng-rank0.pt").stat().st_mode & 0o020  # group-writable as written
    manifest.write(path)
    manifest.verify(path)


def test_a_tampered_metadata_is_refused_before_it_is_unpickled(ckpt, tmp_path, no_dcp_load):
    ran = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return open, (str(ran), "w")

    (ckpt / "dcp" / ".metadata").write_bytes(pickle.dumps(Payload()))
    _refused(ckpt, r"dcp/\.metadata does not match its (size|sha256)")
    assert not ran.exists()


def test_a_flipped_byte_of_the_same_size_is_refused(ckpt, no_dcp_load):
    shard = ckpt / "dcp" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    _refused(ckpt, r"__0_0\.distcp does not match its sha256")


def test_a_missing_or_extra_file_or_manifest_is_refused(ckpt, no_dcp_load):
    (ckpt / "dcp" / "extra.distcp").write_bytes(b"")
    _refused(ckpt, r"dcp/extra\.distcp is not listed in manifest\.json")
    (ckpt / "dcp" / "extra.distcp").unlink()
    (ckpt / "rng-rank0.pt").unlink()
    _refused(ckpt, r"rng-rank0\.pt is listed in manifest\.json but missing")
    (ckpt / MANIFEST).unlink()
    _refused(ckpt, r"it has no manifest\.json")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_a_file_owned_by_another_user_is_refused(ckpt, no_dcp_load):
    os.chown(ckpt / "dcp" / "__0_0.distcp", 12345, -1)
    line = _refused(ckpt, r"dcp/__0_0\.distcp is owned by uid 12345, not this user")
    assert "resume only from checkpoints you wrote" in line


@pytest.mark.parametrize("rel, bits", [("rng-rank0.pt", 0o020), ("dcp", 0o002), (".", 0o020)])
def test_a_group_or_world_writable_entry_is_refused(ckpt, no_dcp_load, rel, bits):
    path = ckpt / rel
    path.chmod(path.stat().st_mode | bits)
    line = _refused(ckpt, "is group- or world-writable")
    assert f"chmod -R go-w {ckpt}" in line


def test_a_symlink_is_refused_even_to_identical_bytes(ckpt, tmp_path, no_dcp_load):
    outside = tmp_path / "elsewhere.pt"
    os.replace(ckpt / "rng-rank0.pt", outside)
    (ckpt / "rng-rank0.pt").symlink_to(outside)
    _refused(ckpt, r"rng-rank0\.pt is a symbolic link")
