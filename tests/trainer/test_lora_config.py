"""``trainer.lora``: bad values and combinations stop before Ray starts with one line naming the field and
the fix; targets the model does not have (or that are not linears, or are tied to the embeddings, as the
tiny Llama's lm_head is) stop when the model is wrapped."""

from __future__ import annotations

import pytest
import torch

from relayrl.config import ConfigError, LoraConfig, load_config
from relayrl.trainer.lora import wrap


def test_default_is_off_and_an_override_turns_it_on():
    assert load_config("grpo_tiny").trainer.lora.r == 0
    lora = load_config("grpo_tiny", ["trainer.lora.r=8"]).trainer.lora
    assert (lora.r, lora.alpha, lora.dropout) == (8, 16.0, 0.0)
    assert lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["trainer.lora.r=-1"], r"trainer\.lora\.r=-1 must be >= 0"),
        (["trainer.lora.r=8", "trainer.lora.alpha=0"], r"trainer\.lora\.alpha=0.0 must be > 0"),
        (
            ["trainer.lora.r=8", "trainer.lora.dropout=0.1"],
            r"trainer\.lora\.dropout=0.1: .* set trainer\.lora\.dropout=0",
        ),
        (["trainer.lora.r=8", "trainer.lora.target_modules=[]"], r"trainer\.lora\.target_modules is empty"),
        (
            ["trainer.lora.r=8", "trainer.world_size=2", "trainer.tp_size=2"],
            r"set trainer\.tp_size=1 or trainer\.lora\.r=0",
        ),
    ],
)
def test_bad_lora_config_is_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as err:
        load_config("grpo_tiny", overrides)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "targets, match",
    [
        (["nonexistent_proj"], r"matches no layer of this model"),
        (["embed_tokens"], r"not a linear layer"),
        (["q_proj", "lm_head"], r"'lm_head', whose weight is tied"),
    ],
)
def test_targets_the_model_cannot_take(tiny_llama, targets, match):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    with pytest.raises(ConfigError, match=match) as err:
        wrap(model, LoraConfig(r=4, target_modules=targets))
    assert "\n" not in str(err.value)
