"""Activation checkpointing (``trainer.activation_checkpointing``): keep a decoder layer's input, recompute
the rest of its activations in the backward.

Without it, autograd keeps every layer's intermediate tensors until the backward: per token and layer
about ``7 H + 2 H_kv + 4 I`` floats for a Llama-style block (norm inputs, q/k/v and the attention output,
the MLP's gate, up, activation and product; H hidden, H_kv the KV width, I the MLP width), so activations
grow as O(tokens x layers x (H + I)). With a layer checkpointed only its input (H floats a token) stays,
and one layer's worth is rebuilt at a time in the backward: O(tokens x layers x H) + O(tokens x (H + I)),
for one more forward of that layer.

Applied with torch's composable ``checkpoint`` (``torch.distributed._composable``) on the decoder layers,
before FSDP2's ``fully_shard``, as torchtitan orders them. The composable form rather than
``checkpoint_wrapper``: the wrapper inserts a ``_checkpoint_wrapped_module`` level into every parameter
name, and the weight sync, the HF export and the engines all key weights by the HF names
(``hf.py``); the composable form hooks the layer in place and leaves the names alone.

``mode``: ``off``; ``full`` (every layer); an integer N (every N-th layer: layers 0, N, 2N, ...; memory
between the two); ``auto`` (``resolve_every``): full when the estimated activations of the longest
micro-batch would take more than a quarter of a rank's memory, else off.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import torch

from relayrl.config.model import ModelConfig
from relayrl.config.trainer import AUTO_SHARE, TrainerConfig, every_of

logger = logging.getLogger(__name__)


def activation_bytes(model_config: Mapping[str, Any], tokens: int) -> int:
    """Estimated float32 activations autograd keeps for ``tokens`` tokens without checkpointing (module
    docstring): ``4 x tokens x layers x (7 H + 2 H_kv + 4 I)`` bytes."""
    h, layers = model_config["hidden_size"], model_config["num_hidden_layers"]
    heads = model_config["num_attention_heads"]
    kv = (model_config.get("num_key_value_heads") or heads) * (model_config.get("head_dim") or h // heads)
    inter = model_config.get("intermediate_size") or 4 * h
    return 4 * tokens * layers * (7 * h + 2 * kv + 4 * inter)


def long_rows(model_config: Mapping[str, Any], tokens: int, memory_bytes: int) -> bool:
    """Whether micro-batches of ``tokens`` tokens are *long*: their estimated activations without checkpointing
    (``activation_bytes``) over ``AUTO_SHARE`` of a rank's memory. Long rows turn ``auto`` checkpointing on, and on a
    CPU host they run the rank under ``LONG_ROWS_MALLOC_ENV`` (``config.runtime.malloc_env``)."""
    return activation_bytes(model_config, tokens) > AUTO_SHARE * memory_bytes


def resolve_every(mode: str, model_config: Mapping[str, Any], tokens: int, memory_bytes: int) -> int:
    """The layer stride to checkpoint (0: none): ``mode``'s, or for ``auto`` 1 when the rows are long
    (``long_rows``), else 0."""
    every = every_of(mode)  # checked when the config loaded
    if every is not None:
        return every
    return int(long_rows(model_config, tokens, memory_bytes))


def micro_batch_tokens(trainer: TrainerConfig, model: ModelConfig) -> int:
    """Tokens a rank computes in its longest micro-batch, as ``auto`` sizes it: the larger of
    ``trainer.max_tokens_per_micro_batch`` and ``model.max_model_len``, over the context-parallel ranks."""
    return -(-max(trainer.max_tokens_per_micro_batch, model.max_model_len) // trainer.cp_size)


def rank_rows_are_long(model_path: str, trainer: TrainerConfig, model: ModelConfig, ranks_on_host: int) -> bool:
    """``long_rows`` for a CPU trainer rank of this run (one of ``ranks_on_host`` sharing the host's memory)."""
    import json
    from pathlib import Path

    config = Path(model_path) / "config.json"
    if not config.is_file():  # the ranks' model load names the missing model in its own error
        return False
    model_config = json.loads(config.read_text())
    memory = rank_memory_bytes(torch.device("cpu"), ranks_on_host)
    return long_rows(model_config, micro_batch_tokens(trainer, model), memory)


def rank_memory_bytes(device: torch.device, ranks_on_host: int) -> int:
    """What one rank may use: the GPU's memory, or on a CPU host its RAM shared by the host's ranks."""
    import os

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(1, ranks_on_host)


def checkpoint_layers(model: torch.nn.Module, every: int) -> int:
    """Checkpoint every ``every``-th decoder layer of ``model`` in place (0: none); returns how many.

    Decoder layers are the modules whose class is in the HF model's ``_no_split_modules`` (as
    ``fsdp.shard_model`` finds them), in model order. The model's KV cache is switched off: a recomputed
    layer would append its keys to the cache a second time."""
    from torch.distributed._composable import checkpoint

    if every <= 0:
        return 0
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} names no decoder layer class (_no_split_modules); "
            "set trainer.activation_checkpointing=off"
        )
    cast(Any, model).config.use_cache = False
    chosen = layers[::every]
    for layer in chosen:
        checkpoint(layer)
    return len(chosen)
