"""vllm-native backend (vLLM's NCCL engine) from an FSDP2 trainer on GPU; skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from relayrl.config import load_config
from relayrl.rollout import start_rollout_actor
from relayrl.trainer.ranks import TrainerGroup

pytestmark = pytest.mark.gpu
PROBE = [269, 266, 455, 270, 356, 33, 343, 226, 493, 395, 231]


def test_nccl_sync_reaches_the_engine(ray_session, tiny_llama):
    cfg = load_config(
        "grpo_tiny",
        [
            f"model.path={tiny_llama}",
            "weightsync.backend=vllm-native",
            "weightsync.native_engine=nccl",
            "trainer.backend=nccl",
        ],
    )
    rollout = start_rollout_actor(str(tiny_llama), cfg.model, cfg.rollout, 0, sync_cfg=cfg.weightsync, num_gpus=1)
    trainer = TrainerGroup(1, str(tiny_llama), cfg.model, cfg.trainer, cfg.algorithm)
    try:
        trainer.connect_rollouts(cfg.weightsync, [rollout])
        stats = trainer.sync_weights(1)
        assert stats["weightsync/version"] == 1 and ray_session.get(rollout.weight_version.remote()) == 1
        engine = torch.tensor(ray_session.get(rollout.prompt_logprobs.remote(PROBE)))
        assert torch.allclose(engine, torch.tensor(trainer.sequence_logprobs(PROBE, temperature=1.0)), atol=1e-2)
    finally:
        trainer.shutdown()
        ray_session.kill(rollout)
