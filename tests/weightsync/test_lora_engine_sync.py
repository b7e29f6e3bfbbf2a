"""A LoRA trainer's sync into a real vLLM engine: after one GRPO step, the engine scores tokens as the
trainer's merged model does (the full-weight parity test's tolerance, 1e-3), the engine needed no LoRA
support, and the sync moved the base model's bytes under its names.

Real path: vLLM rollout actor generates -> rewards -> FSDP2 trainer step on PEFT adapters -> shm sync of
``MergedLoraSource`` (bucketed gather, merge, engine verify + commit).
"""

from __future__ import annotations

import pytest
import torch

from relayrl.rewards import builtin, score_groups
from tests.controller.test_trainer_engine_parity import PROMPTS, engine_and_trainer


@pytest.fixture(scope="module")
def pair(ray_session, tiny_llama, tmp_path_factory):
    yield from engine_and_trainer(
        ray_session, tiny_llama, tmp_path_factory.mktemp("shm"), ["trainer.lr=5e-2", "trainer.lora.r=8"]
    )


def test_engine_logprobs_match_merged_lora_trainer_after_sync(pair, ray_session, tiny_llama):
    from transformers import AutoModelForCausalLM

    _cfg, rollout, trainer = pair
    groups = ray_session.get(rollout.generate.remote(PROMPTS, 4))
    score_groups(groups, [("digit_fraction", builtin.digit_fraction, 1.0)])
    probe = groups[0].trajectories[0].prompt_token_ids + groups[0].trajectories[0].completion_token_ids
    engine_before = torch.tensor(ray_session.get(rollout.prompt_logprobs.remote(probe)))
    assert torch.allclose(engine_before, torch.tensor(trainer.sequence_logprobs(probe)), atol=1e-3)

    stats = trainer.train_step([ray_session.put(groups)])
    assert stats["grad_norm"] > 0
    sync = trainer.sync_weights(version=1)
    base = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    base_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    assert sync["weightsync/version"] == 1 and base_bytes <= sync["weightsync/bytes"] < base_bytes + (1 << 16)

    engine_after = torch.tensor(ray_session.get(rollout.prompt_logprobs.remote(probe)))
    trainer_after = torch.tensor(trainer.sequence_logprobs(probe))
    assert ray_session.get(rollout.weight_version.remote()) == 1
    assert (engine_after - engine_before).abs().max() > 1e-3, "the adapters' update did not reach the engine"
    assert torch.allclose(engine_after, trainer_after, atol=1e-3), (engine_after - trainer_after).abs().max()
    merged = trainer.state_dict()
    assert set(merged) == set(base.state_dict())  # the merged model under the base model's names
    new = ray_session.get(rollout.generate.remote(PROMPTS[:1], 2))[0]
    assert all(t.versions[0].version == 1 for t in new.trajectories)
