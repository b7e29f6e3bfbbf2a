"""LoRA trainer ranks on real Ray + gloo + FSDP2 (2 ranks) with the tiny Llama and real PEFT.

What must hold: only the adapters train (AdamW state and checkpoint hold them alone, the base weights
never move); the merged model is what ``state_dict`` / ``save_hf`` give and what loads in transformers;
the KL reference is the base (adapters off); a checkpoint round trip restores adapters and AdamW moments
exactly, so the step after a resume equals the uninterrupted one.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from relayrl.config import AlgorithmConfig, LoraConfig, ModelConfig, TrainerConfig
from relayrl.trainer import manifest
from tests.trainer.test_actor import PROBE, TEMPERATURE, _hf_model, _logprobs, _synthetic_groups

LORA = LoraConfig(r=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])
ADAPTED = ("self_attn.q_proj.weight", "self_attn.v_proj.weight", "mlp.down_proj.weight")


def lora_trainer(tiny_llama, world_size: int = 2):
    from relayrl.trainer.ranks import TrainerGroup

    return TrainerGroup(
        world_size,
        str(tiny_llama),
        ModelConfig(path=str(tiny_llama)),
        TrainerConfig(world_size=world_size, lr=1e-2, micro_batch_size=4, num_cpus=0.5, lora=LORA),
        AlgorithmConfig(group_size=3, kl_coef=0.1),
        temperature=TEMPERATURE,
    )


def _checkpoint_keys(path) -> list[str]:
    return list(dcp.FileSystemReader(str(path / "dcp")).read_metadata().state_dict_metadata)


@pytest.fixture(scope="module")
def trained(ray_session, tiny_llama, tmp_path_factory):
    """Two LoRA steps with a checkpoint after the first, then a fresh trainer resumed from it."""
    refs = [ray_session.put(_synthetic_groups(vocab=_hf_model(tiny_llama).config.vocab_size))]
    base = _hf_model(tiny_llama)
    ckpt = tmp_path_factory.mktemp("lora") / "ckpt"
    out = {"initial": base.state_dict(), "base_params": sum(p.numel() for p in base.parameters())}
    first = lora_trainer(tiny_llama)
    try:
        out["counts"] = first.param_counts()
        out["stats"] = [first.train_step(refs)]
        first.save_checkpoint(str(ckpt))
        out["saved"] = first.state_dict()
        out["stats"].append(first.train_step(refs))
        out["uninterrupted"] = first.state_dict()
        out["probe"] = torch.tensor(first.sequence_logprobs(PROBE))
        out["hf_dir"] = first.save_hf(str(tmp_path_factory.mktemp("lora_hf") / "model"))
    finally:
        first.shutdown()
    manifest.write(ckpt)  # the driver's commit
    second = lora_trainer(tiny_llama)  # a fresh trainer, as after a crash
    try:
        second.load_checkpoint(str(ckpt))
        out["loaded"] = second.state_dict()
        second.train_step(refs)  # needs the restored adapters and Adam moments
        out["resumed"] = second.state_dict()
    finally:
        second.shutdown()
    out["keys"] = _checkpoint_keys(ckpt)
    return out


def test_only_adapters_train(trained):
    """The trainable count is the adapters' (A [4, in] + B [out, 4] per adapted linear); after two steps
    every adapted weight moved and nothing else did, and the state dict has the base model's names."""
    initial, final = trained["initial"], trained["uninterrupted"]
    n_train, n_all = trained["counts"]
    per_layer = sum(4 * (i + o) for i, o in ((128, 128), (128, 64), (256, 128)))  # q, v, down of the tiny Llama
    assert n_train == 2 * per_layer and n_all == trained["base_params"] + n_train
    assert set(final) == set(initial)
    adapted = [k for k in initial if k.endswith(ADAPTED)]
    assert len(adapted) == 6 and all(not torch.allclose(final[k], initial[k], atol=1e-5) for k in adapted)
    assert all(torch.equal(final[k], initial[k]) for k in initial if k not in adapted)


def test_kl_reference_is_the_base_model(trained):
    """Step 1 starts at B = 0 (policy = base): KL 0. Step 2's policy has moved, so its KL to the reference
    (the same model with adapters bypassed) is positive; were the adapters not bypassed it would stay 0."""
    first, second = trained["stats"]
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)
    assert second["kl"] > 1e-6


def test_checkpoint_holds_adapters_and_their_adam_state_only(trained):
    keys = trained["keys"]
    model_keys = [k for k in keys if k.startswith("policy.model.")]
    optim_keys = [k for k in keys if k.startswith("policy.optim.state.")]
    assert len(model_keys) == 12 and all(".lora_A." in k or ".lora_B." in k for k in model_keys)
    assert optim_keys and all(".lora_A." in k or ".lora_B." in k for k in optim_keys)
    assert {k.rsplit(".", 1)[1] for k in optim_keys} >= {"exp_avg", "exp_avg_sq"}


def test_resume_restores_adapters_and_takes_the_same_step(trained):
    saved, loaded = trained["saved"], trained["loaded"]
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)
    resumed, uninterrupted = trained["resumed"], trained["uninterrupted"]
    assert max((resumed[k] - uninterrupted[k]).abs().max().item() for k in saved) < 1e-6


def test_save_hf_writes_the_merged_model(trained):
    """The exported directory is a plain HF model (no adapter files) that loads in transformers, holds the
    merged weights and scores tokens as the trainer did."""
    from pathlib import Path

    model = _hf_model(trained["hf_dir"])
    assert not (Path(trained["hf_dir"]) / "adapter_config.json").exists()
    final = trained["uninterrupted"]
    assert all(torch.equal(v, final[k]) for k, v in model.state_dict().items())
    assert torch.allclose(_logprobs(model, PROBE), trained["probe"], atol=1e-5)


def test_ppo_critic_trains_beside_a_lora_policy(ray_session, tiny_llama):
    """PPO (algorithm.name=gae) with LoRA: the critic is its own full-weight model and learns; the policy
    moves only in its adapted weights; the KL in the reward uses the base (adapters off)."""
    from relayrl.trainer.ranks import TrainerGroup

    base = _hf_model(tiny_llama)
    trainer = TrainerGroup(
        1,
        str(tiny_llama),
        ModelConfig(path=str(tiny_llama)),
        TrainerConfig(lr=1e-2, micro_batch_size=4, lora=LORA),
        AlgorithmConfig(name="gae", group_size=3, kl_coef=0.1, kl_estimator="k1"),
        temperature=TEMPERATURE,
    )
    try:
        refs = [ray_session.put(_synthetic_groups(vocab=base.config.vocab_size))]
        stats = [trainer.train_step(refs) for _ in range(2)]
        final = trainer.state_dict()
    finally:
        trainer.shutdown()
    initial = base.state_dict()
    assert all(s["value_loss"] > 0 for s in stats)
    assert all(torch.equal(final[k], initial[k]) for k in initial if not k.endswith(ADAPTED))
    assert any(not torch.equal(final[k], initial[k]) for k in initial if k.endswith(ADAPTED))
