"""Colocated GPUs: the trainer's state leaves the GPU and comes back unchanged; skipped without CUDA.

Two trainers with one seed train on the same batch; the second offloads and onloads after its first step.
A step's loss is computed *before* that step's update, so the losses that can reveal a broken onload are:
step 2's (forward on the onloaded parameters) and step 3's (parameters after an AdamW update that read the
onloaded moments: zeroed or stale moments change it). Step 1's loss precedes any offload and only shows that
the two trainers start alike.
"""

from __future__ import annotations

import pytest
import torch

from relayrl.config import load_config
from relayrl.trainer.ranks import TrainerGroup
from tests.trainer.test_actor import _synthetic_groups

pytestmark = pytest.mark.gpu
STEPS = 3


def _train(cfg, tiny_llama, groups: list, offload: bool) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """``STEPS`` train steps (offload + onload after the first when ``offload``); their stats, final weights."""
    trainer = TrainerGroup(1, str(tiny_llama), cfg.model, cfg.trainer, cfg.algorithm, seed=0)
    try:
        stats = [trainer.train_step([groups])]
        if offload:
            moved = trainer.offload()
            assert moved > 0 and trainer.offload() == 0  # params, grads-free, AdamW moments
            assert trainer.onload() == moved
        stats += [trainer.train_step([groups]) for _ in range(STEPS - 1)]
        return stats, trainer.state_dict()
    finally:
        trainer.shutdown()


def _same_stats(moved: dict, plain: dict, step: int) -> None:
    """Every numeric stat but timings equal up to float noise (GPU reductions may reorder sums)."""
    assert moved.keys() == plain.keys()
    for key, value in plain.items():
        if "seconds" not in key:
            assert moved[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (step, key)


def test_offload_and_onload_keep_training_identical(ray_session, tiny_llama):
    from safetensors.torch import load_file

    cfg = load_config("grpo_tiny", [f"model.path={tiny_llama}", "trainer.backend=nccl"])
    groups = _synthetic_groups(vocab=256)
    plain, plain_weights = _train(cfg, tiny_llama, groups, offload=False)
    moved, moved_weights = _train(cfg, tiny_llama, groups, offload=True)
    initial = load_file(tiny_llama / "model.safetensors")
    changed = [k for k in initial if k in plain_weights and not torch.equal(initial[k], plain_weights[k])]
    assert changed, "training changed no weight, so equal weights below would prove nothing"
    assert moved[0]["loss"] == plain[0]["loss"]  # same start, before any offload
    for step in range(1, STEPS):  # after the offload + onload
        _same_stats(moved[step], plain[step], step)
    assert moved_weights.keys() == plain_weights.keys()
    for name, weight in plain_weights.items():  # after 2 AdamW steps on onloaded moments
        torch.testing.assert_close(moved_weights[name], weight, rtol=1e-5, atol=1e-7, msg=name)
