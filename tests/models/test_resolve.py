"""resolve_model: built-in names, local directories, and a one-line error for anything else."""

from __future__ import annotations

import pytest

from relayrl.models import ModelNotFoundError, load_tokenizer, resolve_model


def test_unknown_name_names_the_field_and_the_fix(tmp_path):
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("gpt-17", cache_dir=tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert "model.path='gpt-17'" in message and "smollm2, tiny-llama, tiny-qwen2" in message
    assert isinstance(err.value, ValueError)


def test_directory_without_config_is_rejected(tmp_path):
    (tmp_path / "weights").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"config\.json"):
        resolve_model(str(tmp_path / "weights"))


def test_local_directory_is_returned(tiny_llama):
    assert resolve_model(str(tiny_llama)) == tiny_llama.resolve()


def test_builtin_tiny_is_built_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAYRL_CACHE", str(tmp_path / "env-cache"))
    path = resolve_model("tiny-qwen2")
    assert path == tmp_path / "env-cache" / "models" / "tiny-qwen2"
    assert (path / "config.json").is_file()
    assert resolve_model("tiny-qwen2", cache_dir=tmp_path / "arg") == tmp_path / "arg" / "models" / "tiny-qwen2"


def test_load_tokenizer(tiny_llama):
    assert load_tokenizer(tiny_llama).eos_token == "<|im_end|>"


def test_the_driver_loads_a_models_tokenizer_once(tiny_llama, monkeypatch):
    """The prompt check before Ray and the sampler after it share one load (no second AutoTokenizer call)."""
    from transformers import AutoTokenizer

    from relayrl.config import load_config
    from relayrl.controller.system import make_sampler
    from relayrl.preflight import check_prompt_lengths

    load_tokenizer.cache_clear()
    calls = []
    real = AutoTokenizer.from_pretrained  # bound to AutoTokenizer, the only class that calls it here

    def counting(cls, *args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(counting))
    cfg = load_config("grpo_arith", [f"model.path={tiny_llama}"])
    check_prompt_lengths(cfg, tiny_llama, [{"question": "1 + 2 = ?", "answer": "3"}], "data.task=arith")
    sampler = make_sampler(cfg, tiny_llama)
    assert calls == [tiny_llama]
    assert sampler.format_prompt("1 + 2 = ?").endswith("assistant\n")
