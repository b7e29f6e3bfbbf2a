"""Asynchronous DCP saves (``trainer.checkpoint.Saver``): what lands on disk is the state at the save
call, even though training changes the weights and AdamW moments while the write runs."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint._async_thread_executor as executor

from relayrl.trainer import manifest
from relayrl.trainer.checkpoint import Parts, Saver, load


def _parts(seed: int) -> Parts:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    return {"policy": (model, torch.optim.AdamW(model.parameters(), lr=1e-2))}


def _step(parts: Parts) -> None:
    model, optim = parts["policy"]
    model(torch.randn(16, 64)).square().mean().backward()
    optim.step()
    optim.zero_grad()


def _snapshot(parts: Parts) -> dict[str, torch.Tensor]:
    model, optim = parts["policy"]
    out = {f"w.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, state in enumerate(optim.state.values()):
        out |= {f"o.{i}.{k}": v.clone() for k, v in state.items()}
    return out


@pytest.fixture
def held_write(monkeypatch) -> threading.Event:
    """The background write starts only once the returned event is set (DCP's thread executor)."""
    go, write = threading.Event(), executor.save_wrapper

    def wait_then_write(*args, **kwargs):
        assert go.wait(timeout=60)
        return write(*args, **kwargs)

    monkeypatch.setattr(executor, "save_wrapper", wait_then_write)
    return go


def test_async_save_keeps_the_state_of_the_save_call(tmp_path: Path, held_write: threading.Event):
    trainer, saver = _parts(0), Saver()
    _step(trainer)
    saver.save(tmp_path, trainer, rank=0, asynchronous=True)
    at_save = _snapshot(trainer)
    assert not saver.done()  # the write is held: save returned before it
    for _ in range(3):  # training goes on before the write runs
        _step(trainer)
    held_write.set()
    saver.wait()
    assert saver.done()
    assert any(not torch.equal(at_save[k], v) for k, v in _snapshot(trainer).items())
    manifest.write(tmp_path)  # the driver's commit
    fresh = _parts(1)
    load(tmp_path, fresh, rank=0)
    restored = _snapshot(fresh)
    assert restored.keys() == at_save.keys()
    assert all(torch.equal(restored[k], at_save[k]) for k in at_save)


def test_next_save_waits_for_the_previous_write(tmp_path: Path):
    trainer, saver = _parts(0), Saver()
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    _step(trainer)
    saver.save(tmp_path / "a", trainer, rank=0, asynchronous=True)
    first = _snapshot(trainer)
    _step(trainer)
    saver.save(tmp_path / "b", trainer, rank=0, asynchronous=True)  # must finish "a" first
    assert (tmp_path / "a" / "dcp" / ".metadata").exists()
    saver.wait()
    manifest.write(tmp_path / "a")
    fresh = _parts(1)
    load(tmp_path / "a", fresh, rank=0)
    assert all(torch.equal(_snapshot(fresh)[k], first[k]) for k in first)


def test_two_ranks_train_while_their_checkpoint_is_written(ray_session, tiny_llama, tmp_path):
    """The real ``TrainerGroup`` (2 FSDP2 ranks over gloo): the background write's collectives run beside
    a training step's and a weight gather; a fresh group loads exactly the weights of the save."""
    from transformers import AutoConfig

    from tests.trainer.test_actor import _synthetic_groups
    from tests.trainer.test_checkpoint import two_rank_trainer

    refs = [ray_session.put(_synthetic_groups(vocab=AutoConfig.from_pretrained(tiny_llama).vocab_size))]
    make = lambda: two_rank_trainer(tiny_llama)  # noqa: E731
    first = make()
    try:
        first.train_step(refs)
        first.save_checkpoint(str(tmp_path), asynchronous=True)
        saved = {k: v.clone() for k, v in first.state_dict().items()}
        first.train_step(refs)
        assert first.checkpoint_written(wait=True)
        moved = first.state_dict()
    finally:
        first.shutdown()
    manifest.write(tmp_path)
    second = make()
    try:
        second.load_checkpoint(str(tmp_path))
        loaded = second.state_dict()
    finally:
        second.shutdown()
    assert any(not torch.equal(moved[k], saved[k]) for k in saved)
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)
