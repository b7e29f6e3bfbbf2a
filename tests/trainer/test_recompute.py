"""Activation checkpointing: the same gradients as without it (fp32, 1e-6), under FSDP2, with HF names,
and fewer tensors kept for the backward; ``auto`` decided by hand-worked numbers."""

from __future__ import annotations

import pytest
import torch

from relayrl.config import ConfigError, ModelConfig, load_config
from relayrl.trainer.fsdp import shard_model
from relayrl.trainer.recompute import activation_bytes, checkpoint_layers, long_rows, micro_batch_tokens, resolve_every
from tests.trainer.test_packing import SHARED, local_actor, step_loss_and_grads, step_share, synthetic_groups

# h 4, 2 layers, 2 heads of 2 (KV heads 1 -> KV width 2), MLP 8: 7*4 + 2*2 + 4*8 = 64 floats a token-layer
TINY = {
    "hidden_size": 4,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 8,
}


def test_activation_estimate_and_auto_by_hand():
    assert activation_bytes(TINY, tokens=10) == 4 * 10 * 2 * 64 == 5120
    assert resolve_every("auto", TINY, 10, memory_bytes=4 * 5120) == 0  # 5120 is not over a quarter
    assert resolve_every("auto", TINY, 10, memory_bytes=4 * 5120 - 4) == 1
    assert resolve_every("off", TINY, 10, 1) == 0
    assert resolve_every("full", TINY, 10, 10**12) == 1
    assert resolve_every("3", TINY, 10, 10**12) == 3
    assert long_rows(TINY, 10, 4 * 5120 - 4) and not long_rows(TINY, 10, 4 * 5120)  # auto's own test


def test_long_rows_run_the_rank_under_glibcs_default_malloc():
    """The malloc settings a trainer rank starts with: the heap-keeping ones for short micro-batches, glibc's
    defaults for long ones (their activations would ratchet a heap that keeps every freed block)."""
    from relayrl.config import CPU_MALLOC_ENV, LONG_ROWS_MALLOC_ENV, TrainerConfig
    from relayrl.trainer.ranks import TrainerGroup

    def env(long: bool) -> dict:
        return TrainerGroup._options(2, TrainerConfig(), None, long)[1]["runtime_env"]["env_vars"]

    assert CPU_MALLOC_ENV.items() <= env(False).items()
    assert LONG_ROWS_MALLOC_ENV.items() <= env(True).items()
    assert not (set(CPU_MALLOC_ENV) - set(LONG_ROWS_MALLOC_ENV)) & set(env(True))  # no heap-keeping setting left
    assert (
        micro_batch_tokens(
            TrainerConfig(max_tokens_per_micro_batch=3000, world_size=2, cp_size=2), ModelConfig(max_model_len=8193)
        )
        == 4097
    )


@pytest.mark.parametrize("every", [1, 2])
def test_checkpointed_gradients_equal_the_plain_ones(one_rank_group, tiny_llama, every):
    share = step_share(synthetic_groups())
    plain = step_loss_and_grads(local_actor(tiny_llama, **SHARED), share, "token-mean")
    actor = local_actor(tiny_llama, **SHARED)
    layers = sum(type(m).__name__ == "LlamaDecoderLayer" for m in actor.model.modules())
    assert checkpoint_layers(actor.model, every) == -(-layers // every)
    ckpt = step_loss_and_grads(actor, share, "token-mean")
    assert abs(plain[0] - ckpt[0]) < 1e-6 and plain[1].keys() == ckpt[1].keys()
    for name, g in plain[1].items():
        torch.testing.assert_close(ckpt[1][name], g, atol=1e-6, rtol=0, msg=name)


def _saved_tensors(model, ids) -> int:
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids).logits.sum()
    return count


def test_under_fsdp2_names_stay_hf_and_fewer_tensors_are_kept(one_rank_group, tiny_llama):
    from torch.distributed.device_mesh import init_device_mesh

    from tests.trainer.test_packing import plain_model

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    names = [n for n, _ in plain_model(tiny_llama).named_parameters()]
    plain = shard_model(plain_model(tiny_llama), mesh, "float32", trainable=True)
    ckpt = shard_model(plain_model(tiny_llama), mesh, "float32", trainable=True, checkpoint_every=1)
    assert [n for n, _ in ckpt.named_parameters()] == names
    ids = torch.tensor([[5, 9, 3, 7, 8, 2, 4]])
    assert _saved_tensors(ckpt, ids) < _saved_tensors(plain, ids)
    for model in (plain, ckpt):
        model(input_ids=ids).logits.logsumexp(-1).sum().backward()
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(b.grad.full_tensor(), a.grad.full_tensor(), atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize(
    "override,field",
    [
        ("trainer.activation_checkpointing=sometimes", "activation_checkpointing"),
        ("trainer.logits_chunk=0", "logits_chunk"),
    ],
)
def test_config_rejects_bad_memory_knobs(override, field):
    with pytest.raises(ConfigError, match=field):
        load_config("grpo_tiny", [override])
    assert load_config("grpo_tiny", ["trainer.activation_checkpointing=2"]).trainer.activation_checkpointing == "2"
