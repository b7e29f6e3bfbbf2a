"""Tensor parallelism on both sides, on 4 GPUs (skipped without them): a tp=2 trainer (nccl, one GPU per
rank) syncs into a vLLM engine with tensor_parallel_size=2 (the actor holds 2 GPUs) through relayrl's shm and
broadcast engines. Each vLLM worker receives the full weights and its ``load_weights`` keeps its shard; the
engine must then score a probe exactly like the trainer."""

from __future__ import annotations

import pytest
import torch

from relayrl.config import load_config
from relayrl.rollout import start_rollout_actor
from relayrl.trainer.ranks import TrainerGroup
from tests.trainer.test_actor import _synthetic_groups
from tests.trainer.test_tp import tp_friendly

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 GPUs (trainer tp=2, vLLM tp=2)"),
]
PROBE = [269, 266, 455, 270, 356, 33, 343, 226, 493, 395, 231]


@pytest.mark.parametrize("backend", ["shm", "broadcast"])
def test_tp2_trainer_syncs_into_tp2_engine(ray_session, tiny_llama, tmp_path, backend):
    path = tp_friendly(tiny_llama, tmp_path / "tiny-llama-kv2")
    cfg = load_config(
        "grpo_tiny",
        [
            f"model.path={path}",
            f"weightsync.backend={backend}",
            "trainer.backend=nccl",
            "trainer.world_size=2",
            "trainer.tp_size=2",
            "rollout.tp_size=2",
        ],
    )
    rollout = start_rollout_actor(str(path), cfg.model, cfg.rollout, 0, sync_cfg=cfg.weightsync, num_gpus=2)
    trainer = TrainerGroup(2, str(path), cfg.model, cfg.trainer, cfg.algorithm)
    try:
        workers = ray_session.get(rollout.info.remote())["workers"]
        assert workers == 2  # one receiver per TP worker
        trainer.connect_rollouts(cfg.weightsync, [rollout])
        before = torch.tensor(ray_session.get(rollout.prompt_logprobs.remote(PROBE)))
        from transformers import AutoConfig

        groups = _synthetic_groups(vocab=AutoConfig.from_pretrained(path).vocab_size)
        trainer.train_step([groups])
        stats = trainer.sync_weights(1)
        assert stats["weightsync/version"] == 1 and ray_session.get(rollout.weight_version.remote()) == 1
        engine = torch.tensor(ray_session.get(rollout.prompt_logprobs.remote(PROBE)))
        trained = torch.tensor(trainer.sequence_logprobs(PROBE, temperature=1.0))
        assert torch.allclose(engine, trained, atol=1e-2)
        assert (engine - before).abs().max() > 1e-3  # the update reached both shards
    finally:
        trainer.shutdown()
        ray_session.kill(rollout)
