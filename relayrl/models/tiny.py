"""Tiny Llama- and Qwen2-style test models with a byte-level BPE tokenizer trained here.

Nothing is downloaded: the tokenizer is trained on a generated corpus with ``tokenizers`` and the
weights are random (seeded). The directory written is a normal HF model directory (config.json,
model.safetensors, tokenizer files with a chat template), so both transformers and vLLM load it.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relayrl.models._cache import build_once

if TYPE_CHECKING:  # transformers is imported inside the builders: it takes seconds
    from transformers import PretrainedConfig, PreTrainedTokenizerFast

TINY_KINDS = ("tiny-llama", "tiny-qwen2")

# Minimal ChatML-style template: enough for `apply_chat_template` in the data pipeline.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus(n_lines: int = 2000, seed: int = 0) -> list[str]:
    """Arithmetic prompts and answers plus a little English: the text the tiny models will see."""
    rng = random.Random(seed)
    # One sentence of words reads better than 21 quoted items.
    words = (  # noqa: SIM905
        "what is the sum of and answer please compute result give final number "
        "question user assistant system think step reply only"
    ).split()
    lines = []
    for _ in range(n_lines):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        lines.append(f"What is {a} + {b}? Answer: {a + b}")
        lines.append(" ".join(rng.choice(words) for _ in range(8)))
    return lines


def build_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer and wrap it as a transformers fast tokenizer.

    Load it back with ``AutoTokenizer`` (as vLLM does), not by calling this again: for a qwen2
    directory transformers picks ``Qwen2Tokenizer``, which keeps this vocab and these merges but
    pre-splits digits one by one. transformers and vLLM load it the same way, so their ids agree.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
    )


def _model_config(kind: str, vocab_size: int, eos_id: int, pad_id: int) -> PretrainedConfig:
    """2 layers, hidden 128, 2 query heads sharing 1 KV head (GQA): head_dim 64.

    head_dim 64 is one of the sizes vLLM's CPU attention kernel supports (32, 64, 80, ... 256).
    tiny-llama ties lm_head to the embedding and tiny-qwen2 does not, so weight sync is tested with
    both layouts (a tied checkpoint holds no ``lm_head.weight``). About 0.36M / 0.43M
    parameters.
    """
    from transformers import LlamaConfig, Qwen2Config

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
    )
    if kind == "tiny-llama":
        return LlamaConfig(**common, tie_word_embeddings=True)
    if kind == "tiny-qwen2":
        return Qwen2Config(**common, tie_word_embeddings=False)
    raise ValueError(f"unknown tiny model {kind!r}; use one of {TINY_KINDS}")


def build_tiny_model(kind: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny random model of ``kind`` to ``out_dir`` and return the directory.

    Idempotent and safe under concurrent callers: the directory is built once into a temporary
    sibling and renamed into place under a file lock (see ``_cache.build_once``). A complete
    directory already at ``out_dir`` is returned as it is, whatever seed built it.
    """
    if kind not in TINY_KINDS:
        raise ValueError(f"unknown tiny model {kind!r}; use one of {TINY_KINDS}")
    return build_once(Path(out_dir), lambda tmp: _write_tiny_model(kind, tmp, seed))


def _write_tiny_model(kind: str, out: Path, seed: int) -> None:
    """Tokenizer, seeded random float32 weights and a generation config that stops at ``<|im_end|>``."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = build_tokenizer()
    config = _model_config(kind, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):  # seed the init without touching the caller's RNG state
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(out)
