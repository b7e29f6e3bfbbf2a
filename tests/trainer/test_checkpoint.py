"""DCP checkpoints of 2 FSDP2 ranks: loading restores weights and AdamW moments exactly, so the step
after a resume equals the step an uninterrupted trainer takes."""

from __future__ import annotations

import pytest
import torch

from relayrl.config import AlgorithmConfig, ModelConfig, TrainerConfig
from relayrl.trainer import manifest
from tests.trainer.test_actor import _synthetic_groups


def two_rank_trainer(tiny_llama):
    """The 2-rank FSDP2 ``TrainerGroup`` the checkpoint tests save and load."""
    from relayrl.trainer.ranks import TrainerGroup

    return TrainerGroup(
        2,
        str(tiny_llama),
        ModelConfig(path=str(tiny_llama)),
        TrainerConfig(world_size=2, lr=1e-3, micro_batch_size=4, num_cpus=0.5),
        AlgorithmConfig(group_size=3),
        temperature=1.0,
    )


def test_resume_from_checkpoint_takes_the_same_next_step(ray_session, tiny_llama, tmp_path):
    from transformers import AutoConfig

    groups = _synthetic_groups(vocab=AutoConfig.from_pretrained(tiny_llama).vocab_size)
    refs = [ray_session.put(groups)]
    make = lambda: two_rank_trainer(tiny_llama)  # noqa: E731
    first = make()
    try:
        first.train_step(refs)
        first.save_checkpoint(str(tmp_path / "ckpt"))
        saved = {k: v.clone() for k, v in first.state_dict().items()}
        first.train_step(refs)  # the uninterrupted run's step 2
        uninterrupted = first.state_dict()
    finally:
        first.shutdown()
    manifest.write(tmp_path / "ckpt")  # the driver's commit
    second = make()  # a fresh trainer, as after a crash
    try:
        second.load_checkpoint(str(tmp_path / "ckpt"))
        loaded = second.state_dict()
        assert all(torch.equal(loaded[k], saved[k]) for k in saved)
        second.train_step(refs)  # needs the restored Adam moments to match
        resumed = second.state_dict()
    finally:
        second.shutdown()
    assert max((resumed[k] - uninterrupted[k]).abs().max().item() for k in saved) < 1e-6
    assert any(not torch.equal(resumed[k], saved[k]) for k in saved)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "dcp",
        "manifest.json",
        "rng-rank0.pt",
        "rng-rank1.pt",
    ]


def test_a_rank_the_checkpoint_had_not_takes_a_written_ranks_rng(tmp_path):
    """Written by 2 ranks, loaded by 4 (another layout): ranks 2 and 3 take ranks 0's and 1's RNG files."""
    from relayrl.trainer.checkpoint import _rng_file

    for r in range(2):
        (tmp_path / f"rng-rank{r}.pt").write_bytes(b"")
    assert [_rng_file(tmp_path, r).name for r in range(4)] == [f"rng-rank{r % 2}.pt" for r in range(4)]
    with pytest.raises(FileNotFoundError, match="no rng-rank"):
        _rng_file(tmp_path / "missing", 0)
