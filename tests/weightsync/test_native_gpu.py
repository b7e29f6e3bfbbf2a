"""vllm-native backend (vLLM's NCCL and CUDA-IPC engines) from an FSDP2 trainer on GPU; skipped without CUDA.
NCCL: trainer and engine on two GPUs; IPC: both on one GPU (colocated, half a GPU each). Each syncs, checks
the engine's logprobs against the trainer's, then opens an update and aborts it: the engine keeps v1."""

from __future__ import annotations

import pytest
import torch

from relayrl.config import load_config
from relayrl.rollout import start_rollout_actor
from relayrl.trainer.ranks import TrainerGroup

pytestmark = pytest.mark.gpu
PROBE = [269, 266, 455, 270, 356, 33, 343, 226, 493, 395, 231]
GPUS = {"nccl": (1, 1), "ipc": (0.5, 0.5)}  # (engine, trainer rank)


@pytest.mark.parametrize("engine", ["nccl", "ipc"])
def test_native_sync_reaches_the_engine_and_an_abort_keeps_it(ray_session, tiny_llama, engine):
    if engine == "nccl" and torch.cuda.device_count() < 2:
        pytest.skip("nccl: the trainer and the engine on two GPUs")
    overrides = ["weightsync.backend=vllm-native", f"weightsync.native_engine={engine}", "trainer.backend=nccl"]
    cfg = load_config("grpo_tiny", [f"model.path={tiny_llama}", *overrides])
    engine_gpus, trainer_gpus = GPUS[engine]
    rollout = start_rollout_actor(
        str(tiny_llama), cfg.model, cfg.rollout, 0, sync_cfg=cfg.weightsync, num_gpus=engine_gpus
    )
    options = {"num_gpus": trainer_gpus}
    trainer = TrainerGroup(1, str(tiny_llama), cfg.model, cfg.trainer, cfg.algorithm, actor_options=options)
    try:
        trainer.connect_rollouts(cfg.weightsync, [rollout])
        stats = trainer.sync_weights(1)
        assert stats["weightsync/version"] == 1 and ray_session.get(rollout.weight_version.remote()) == 1
        engine_lp = torch.tensor(ray_session.get(rollout.prompt_logprobs.remote(PROBE)))
        trainer_lp = torch.tensor(trainer.sequence_logprobs(PROBE, temperature=1.0))
        assert torch.allclose(engine_lp, trainer_lp, atol=1e-2)
        ray_session.get(rollout.start_weight_update.remote(2, 60.0))
        ray_session.get(rollout.abort_weight_update.remote("test abort"))
        assert ray_session.get(rollout.weight_version.remote()) == 1
        assert ray_session.get(rollout.weight_update_state.remote())["last_abort"] == "v2: test abort"
        assert torch.equal(torch.tensor(ray_session.get(rollout.prompt_logprobs.remote(PROBE))), engine_lp)
    finally:
        trainer.shutdown()
        ray_session.kill(rollout)
