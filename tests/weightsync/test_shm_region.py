"""The shm buffer's header: a payload is readable only after the trainer stamped its version."""

from __future__ import annotations

import os

import pytest
import torch

from relayrl.weightsync.base import FlatUpdateInfo
from relayrl.weightsync.layout import FlatLayout
from relayrl.weightsync.shm import ShmReceiver, ShmRegion, create_private


@pytest.fixture
def layout():
    return FlatLayout.plan([("w", torch.float32, (4, 4))], 1 << 20)


def test_writer_and_reader_share_bytes_and_the_stamp_gates_reads(tmp_path, layout):
    writer = ShmRegion.create(str(tmp_path), layout.nbytes)
    reader = ShmReceiver(layout, {"path": writer.path}, rank=1)
    info = FlatUpdateInfo(version=3, digest=layout.digest)
    with pytest.raises(ValueError, match="mid-write, expected a complete v3"):
        reader.receive(layout, info)  # created, never committed
    writer.begin()
    writer.data[:64].view(torch.float32).copy_(torch.arange(16.0))
    with pytest.raises(ValueError, match="mid-write"):
        reader.receive(layout, info)
    writer.commit(3, layout.digest)
    w = dict(layout.views(reader.receive(layout, info)))["w"]
    assert torch.equal(w, torch.arange(16.0).view(4, 4))  # the same memory, not a copy
    with pytest.raises(ValueError, match="holds v3, expected a complete v4"):
        reader.receive(layout, FlatUpdateInfo(version=4, digest=layout.digest))
    with pytest.raises(ValueError, match="another layout"):
        reader.receive(layout, FlatUpdateInfo(version=3, digest="f" * 16))
    writer.unlink()
    assert not list(tmp_path.iterdir())


def test_missing_dir_is_one_clear_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"weightsync\.shm_dir=.* is not a directory"):
        ShmRegion.create(str(tmp_path / "nope"), 64)


def test_weight_file_is_private_to_the_user(tmp_path):
    region = ShmRegion.create(str(tmp_path), 1024)
    assert os.stat(region.path).st_mode & 0o777 == 0o600


def test_a_planted_file_or_symlink_is_never_written_through(tmp_path):
    target = tmp_path / "victim"
    target.write_bytes(b"keep")
    planted = tmp_path / "weights.bin"
    planted.symlink_to(target)
    with pytest.raises(FileExistsError):
        create_private(str(planted), 4096)
    assert target.read_bytes() == b"keep"
