"""After one real GRPO step and one sync, the engine scores tokens exactly as the trainer does.

Real path: vLLM rollout actor generates -> rewards -> FSDP2 trainer step -> shm sync (bucketed gather,
engine verify + commit) -> engine reload.
"""

from __future__ import annotations

import pytest
import torch

from relayrl.config import load_config
from relayrl.data import Prompt
from relayrl.rewards import builtin, score_groups
from relayrl.rollout import start_rollout_actor
from relayrl.trainer.ranks import TrainerGroup

PROMPTS = [Prompt(i, f"What is {i} + {i + 1}?", {"answer": str(2 * i + 1)}) for i in range(4)]


def engine_and_trainer(ray_session, model, shm_dir, overrides: list[str]):
    """A rollout engine and a one-rank trainer of the tiny recipe on ``model``, connected for weight sync:
    yields (cfg, rollout, trainer), then shuts both down (``yield from`` it in a fixture)."""
    cfg = load_config("grpo_tiny", [f"model.path={model}", f"weightsync.shm_dir={shm_dir}", *overrides])
    rollout = start_rollout_actor(str(model), cfg.model, cfg.rollout, 0, sync_cfg=cfg.weightsync)
    trainer = TrainerGroup(1, str(model), cfg.model, cfg.trainer, cfg.algorithm, temperature=cfg.rollout.temperature)
    trainer.connect_rollouts(cfg.weightsync, [rollout])
    yield cfg, rollout, trainer
    trainer.shutdown()
    ray_session.get(rollout.shutdown.remote())
    ray_session.kill(rollout)


@pytest.fixture(scope="module")
def pair(ray_session, tiny_llama, tmp_path_factory):
    yield from engine_and_trainer(ray_session, tiny_llama, tmp_path_factory.mktemp("shm"), ["trainer.lr=1e-2"])


def test_engine_logprobs_match_trainer_after_sync(pair, ray_session):
    _, rollout, trainer = pair
    groups = ray_session.get(rollout.generate.remote(PROMPTS, 4))
    score_groups(groups, [("digit_fraction", builtin.digit_fraction, 1.0)])
    probe = groups[0].trajectories[0].prompt_token_ids + groups[0].trajectories[0].completion_token_ids

    engine_before = torch.tensor(ray_session.get(rollout.prompt_logprobs.remote(probe)))
    trainer_before = torch.tensor(trainer.sequence_logprobs(probe))
    assert torch.allclose(engine_before, trainer_before, atol=1e-3)

    stats = trainer.train_step([ray_session.put(groups)])
    assert stats["grad_norm"] > 0
    sync = trainer.sync_weights(version=1)
    assert sync["weightsync/version"] == 1 and sync["weightsync/bytes"] > 0

    engine_after = torch.tensor(ray_session.get(rollout.prompt_logprobs.remote(probe)))
    trainer_after = torch.tensor(trainer.sequence_logprobs(probe))
    assert ray_session.get(rollout.weight_version.remote()) == 1
    assert (engine_after - engine_before).abs().max() > 1e-3, "the update did not reach the engine"
    assert torch.allclose(engine_after, trainer_after, atol=1e-3), (engine_after - trainer_after).abs().max()
    new = ray_session.get(rollout.generate.remote(PROMPTS[:1], 2))[0]
    assert all(t.versions[0].version == 1 for t in new.trajectories)


def test_verify_fails_fast_when_the_engine_runs_other_weights(pair, ray_session, tiny_llama):
    """``System.verify_sync`` passes after a real sync and raises once the engine holds other weights."""
    from relayrl.controller.system import System
    from relayrl.weightsync.base import StateDictSource
    from relayrl.weightsync.client import WeightSyncError
    from relayrl.weightsync.sync import TrainerSync
    from tests.rollout.reference import perturbed

    cfg, rollout, trainer = pair
    cfg.weightsync.verify_every, cfg.weightsync.verify_samples = 1, 2
    system = System(cfg, None, [rollout], trainer, None)
    version = ray_session.get(rollout.weight_version.remote()) + 1
    trainer.sync_weights(version)
    refs = [ray_session.put(ray_session.get(rollout.generate.remote(PROMPTS[:2], 2)))]
    assert system.verify_sync(version, refs)["mismatch/max_abs"] < 1e-3
    other = TrainerSync(cfg.weightsync, StateDictSource(perturbed(tiny_llama, 0.05, seed=3)), 0, [rollout], [1])
    other.sync(version + 1)
    other.close()
    with pytest.raises(WeightSyncError, match="not running the trainer's weights"):
        system.verify_sync(version + 1, refs)
