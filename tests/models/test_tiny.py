"""Tiny test models: small, loadable by transformers, with a tokenizer that round-trips and a chat template."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from relayrl.models.tiny import build_tiny_model

VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM CPU_ATTN backend


@pytest.fixture(params=["tiny_llama", "tiny_qwen2"])
def tiny_dir(request):
    return request.getfixturevalue(request.param)


def test_tiny_model_is_small_and_loads(tiny_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    n_params = sum(p.numel() for p in model.parameters())
    assert 300_000 < n_params <= 2_000_000
    assert model.dtype == torch.float32
    config = model.config
    assert config.hidden_size // config.num_attention_heads in VLLM_CPU_HEAD_SIZES


def test_tied_and_untied_layouts(tiny_llama, tiny_qwen2):
    """One tiny model of each lm_head layout, so weight sync meets both."""
    assert AutoConfig.from_pretrained(tiny_llama).tie_word_embeddings is True
    assert AutoConfig.from_pretrained(tiny_qwen2).tie_word_embeddings is False


@pytest.mark.parametrize("text", ["What is 12 + 7? Answer: 19", "héllo wörld 🙂\n\ttabs  and  spaces", ""])
def test_tokenizer_round_trips_text(tiny_dir, text):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert all(0 <= i < len(tok) for i in ids)


def test_tokenizer_learned_merges(tiny_dir):
    """BPE was trained: a frequent corpus word is one token, not its bytes."""
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert len(tok(" answer", add_special_tokens=False)["input_ids"]) == 1


def test_special_tokens(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    config = AutoConfig.from_pretrained(tiny_dir)
    ids = tok("<|im_start|>user<|im_end|>", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens([ids[0], ids[-1]]) == ["<|im_start|>", "<|im_end|>"]
    assert tok.eos_token == "<|im_end|>" and config.eos_token_id == tok.eos_token_id
    assert tok.pad_token == "<|endoftext|>"


def test_chat_template(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_build_is_deterministic_and_idempotent(tmp_path, tiny_llama):
    again = build_tiny_model("tiny-llama", tmp_path / "again", seed=0)
    a = AutoModelForCausalLM.from_pretrained(tiny_llama).state_dict()
    b = AutoModelForCausalLM.from_pretrained(again).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    mtime = (again / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model("tiny-llama", again, seed=1) == again  # already built: returned as is
    assert (again / "model.safetensors").stat().st_mtime_ns == mtime


def test_unknown_kind(tmp_path):
    with pytest.raises(ValueError, match="tiny-llama"):
        build_tiny_model("tiny-gpt", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_build_leaves_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model("tiny-qwen2", tmp_path / "m", seed=5)
    assert torch.equal(torch.rand(3), expected)
