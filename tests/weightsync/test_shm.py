"""The shm backend and the worker extension's load path, without vLLM (a fake worker records calls)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from relayrl.config import WeightSyncConfig
from relayrl.weightsync import BACKENDS, ShmSender, WeightHandle, make_sender
from relayrl.weightsync.worker import WeightSyncExtension, _retie, _tied_parameters


def _state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(6, 4, generator=g)
    return {"embed.weight": emb, "lm_head.weight": emb,             # tied: same storage
            "proj.weight": torch.randn(4, 3, generator=g).t(),      # non-contiguous
            "norm.weight": torch.ones(4, dtype=torch.bfloat16)}


def test_send_then_open_round_trips_bit_exact(tmp_path):
    sd = _state_dict()
    handle = ShmSender(str(tmp_path), tag="t").send(sd, version=3)
    assert handle == WeightHandle("shm", str(tmp_path / "relayrl-t-v3.safetensors"), 3,
                                  nbytes=6 * 4 * 4 * 2 + 12 * 4 + 4 * 2, num_tensors=4)
    got = dict(BACKENDS["shm"].open_weights(handle))
    assert got.keys() == sd.keys()
    for name, tensor in sd.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    with safe_open(handle.location, framework="pt") as f:
        assert f.metadata() == {"version": "3"}


def test_only_newest_file_is_kept_and_no_tmp_is_left(tmp_path):
    sender = ShmSender(str(tmp_path), tag="t")
    first = sender.send(_state_dict(), 1)
    second = sender.send(_state_dict(), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [Path(second.location).name]
    with pytest.raises(FileNotFoundError, match="v1 missing"):
        BACKENDS["shm"].open_weights(first)
    sender.close()
    assert list(tmp_path.iterdir()) == []


def test_handle_that_disagrees_with_file_is_refused(tmp_path):
    handle = ShmSender(str(tmp_path)).send(_state_dict(), 1)
    wrong = WeightHandle(handle.backend, handle.location, 1, handle.nbytes, num_tensors=5)
    with pytest.raises(ValueError, match="holds 4 tensors, the handle says 5"):
        BACKENDS["shm"].open_weights(wrong)


def test_make_sender_falls_back_when_shm_dir_is_absent(tmp_path):
    sender = make_sender(WeightSyncConfig(shm_dir=str(tmp_path / "nope")), fallback_dir=str(tmp_path))
    assert isinstance(sender, ShmSender) and sender.dir == tmp_path
    with pytest.raises(FileNotFoundError, match="weightsync.shm_dir"):
        make_sender(WeightSyncConfig(shm_dir=str(tmp_path / "nope")))
    with pytest.raises(ValueError, match="weightsync.backend='nccl' is unknown"):
        make_sender(WeightSyncConfig(backend="nccl"))


class FakeWorker(WeightSyncExtension):
    """Stands in for vLLM's worker: records what ``reload_weights`` received."""

    def __init__(self):
        self.loaded: dict[str, torch.Tensor] | None = None
        self.model_runner = SimpleNamespace(get_model=lambda: torch.nn.Linear(2, 2))

    def reload_weights(self, weights_iterator):
        self.loaded = dict(weights_iterator)


def test_worker_streams_the_file_into_reload_weights(tmp_path):
    sd = _state_dict()
    handle = ShmSender(str(tmp_path)).send(sd, 1)
    worker = FakeWorker()
    timings = worker.relayrl_load_weights(handle.to_dict(), deadline=time.time() + 60)
    assert set(timings) == {"open_s", "load_s"}
    assert all(torch.equal(worker.loaded[k], v) for k, v in sd.items())


def test_worker_refuses_a_load_that_arrives_after_the_deadline(tmp_path):
    handle = ShmSender(str(tmp_path)).send(_state_dict(), 1)
    worker = FakeWorker()
    with pytest.raises(TimeoutError, match="after the caller's deadline; not loaded"):
        worker.relayrl_load_weights(handle.to_dict(), deadline=time.time() - 1)
    assert worker.loaded is None


def test_worker_fails_on_a_missing_file_before_touching_weights(tmp_path):
    handle = WeightHandle("shm", str(tmp_path / "gone.safetensors"), 7, 0, 1)
    worker = FakeWorker()
    with pytest.raises(FileNotFoundError, match="v7 missing"):
        worker.relayrl_load_weights(handle.to_dict(), deadline=time.time() + 60)
    assert worker.loaded is None


class _PackingHead(torch.nn.Module):
    """Like vLLM's CPU LM head: post-load processing caches a copy of the weight."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight
        self.quant_method = self

    def process_weights_after_loading(self, layer):
        layer.packed = layer.weight.detach().clone()


def test_retie_restores_an_alias_that_a_reload_broke():
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(4, 2)
    model.head = _PackingHead(model.embed.weight)
    ties = _tied_parameters(model)
    assert ties == [(model.head, "weight", model.embed, "weight")]
    model.embed.weight = torch.nn.Parameter(torch.full((4, 2), 7.0))   # reload: new embed, stale head
    _retie(ties)
    assert model.head.weight is model.embed.weight
    assert torch.equal(model.head.packed, torch.full((4, 2), 7.0))
