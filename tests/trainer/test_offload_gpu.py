"""Colocated GPUs: the trainer's state leaves the GPU and comes back unchanged; skipped without CUDA."""

from __future__ import annotations

import pytest

from relayrl.config import load_config
from relayrl.trainer.group import TrainerGroup
from tests.trainer.test_actor import _synthetic_groups

pytestmark = pytest.mark.gpu


def test_offload_and_onload_keep_training_identical(ray_session, tiny_llama):
    cfg = load_config("grpo_tiny", [f"model.path={tiny_llama}", "trainer.backend=nccl"])
    groups = _synthetic_groups(vocab=256)
    runs = []
    for offload in (False, True):
        trainer = TrainerGroup(1, str(tiny_llama), cfg.model, cfg.trainer, cfg.algorithm, seed=0)
        try:
            first = trainer.train_step([groups])
            if offload:
                moved = trainer.offload()
                assert moved > 0 and trainer.offload() == 0          # params, grads-free, AdamW moments
                assert trainer.onload() == moved
            runs.append((first, trainer.train_step([groups])))
        finally:
            trainer.shutdown()
    (a1, a2), (b1, b2) = runs
    assert a1["loss"] == b1["loss"] and a2["loss"] == pytest.approx(b2["loss"], rel=1e-6)
    assert a2["grad_norm"] == pytest.approx(b2["grad_norm"], rel=1e-6)
