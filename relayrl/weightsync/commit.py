"""Commit: load a verified flat buffer into a vLLM model, the only place an engine's weights change.

Two paths (``weightsync.commit``):

``inplace`` (default)  ``model.load_weights`` copies every tensor into the parameter it already has
    (vLLM's weight loaders narrow fused ``qkv_proj`` / ``gate_up_proj`` and copy in place, as vLLM's own
    NCCL engine does on GPU), then, on CPU, each linear layer's packed GEMM copy is rebuilt from its
    parameter (``repack``). On CPU vLLM normally *drops* a linear's weight once its oneDNN handle holds a
    reordered copy, which leaves nothing to copy into; ``keep_cpu_weights`` (run in the engine's
    processes before the model is built) keeps it. Cost: one more copy of the linear weights in engine
    memory; gain: no re-allocation of every parameter (fresh pages, faulted in on first write) and no
    re-processing of layers without weights.
``reload``  vLLM's ``reload_weights``: restore the checkpoint layout, load, re-process every layer. It
    handles quantized or otherwise transformed weights, which ``inplace`` refuses (``can_load_in_place``).
    Tied parameters need one more step there: a checkpoint of a tied model names the shared tensor once
    (embed_tokens) and the reload puts lm_head's *old* tensor back, silently untying it (seen on vLLM
    0.32 CPU: logprobs 0.4 nats off), so aliases are recorded before and re-tied after. vLLM logs
    ``<Layer>: Failed to load weights`` on this path for layers the checkpoint has no tensor for (the
    rotary embedding's cache, the tied ``lm_head``); their previous tensors are put back, which is right,
    and the post-sync probe (``weightsync.verify_every``) checks the result end to end.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from relayrl.weightsync.layout import FlatLayout

KEEP_ENV = "RELAYRL_KEEP_CPU_WEIGHTS"
"""Set to 1 in a rollout actor's environment (inherited by its vLLM processes) when ``commit=inplace``."""


def keep_cpu_weights() -> None:
    """Make vLLM's CPU GEMM dispatch keep each linear's weight beside its packed copy (idempotent).

    ``UnquantizedLinearMethod.process_weights_after_loading`` imports ``dispatch_cpu_unquantized_gemm``
    from ``vllm.model_executor.layers.utils`` when it runs, so replacing the module attribute before the
    model is loaded is enough."""
    import vllm.model_executor.layers.utils as utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "relayrl_keeps_weight", False):
        return

    def dispatch(layer: nn.Module, remove_weight: bool) -> None:
        original(layer, remove_weight=False)

    dispatch.relayrl_keeps_weight = True
    utils.dispatch_cpu_unquantized_gemm = dispatch


def keep_cpu_weights_if_asked() -> None:
    """``keep_cpu_weights`` in an engine process whose rollout actor asked for it (``KEEP_ENV``)."""
    if os.environ.get(KEEP_ENV) == "1":
        keep_cpu_weights()


def load_flat(vllm_config: Any, model: nn.Module, layout: FlatLayout, buffer: torch.Tensor) -> None:
    """Load ``layout``'s tensors (views into ``buffer``) into ``model``: in place where it can, else reload."""
    if can_load_in_place(vllm_config, model):
        load_in_place(model, layout, buffer)
    else:
        reload_flat(vllm_config, model, layout, buffer)


def can_load_in_place(vllm_config: Any, model: nn.Module) -> bool:
    """Unquantized weights whose every linear still holds its parameter (``keep_cpu_weights`` ran on CPU)."""
    if vllm_config.model_config.quantization is not None:
        return False
    return all(m.weight.numel() > 0 for m in linear_layers(model) if hasattr(m, "weight"))


def load_in_place(model: nn.Module, layout: FlatLayout, buffer: torch.Tensor) -> None:
    """Copy every tensor into the parameter that holds it, then rebuild the CPU GEMM copies."""
    model.load_weights(layout.views(buffer))
    repack(model)


def repack(model: nn.Module) -> None:
    """CPU: rebuild each linear layer's packed GEMM copy (oneDNN handle) from its updated parameter.
    Elsewhere the kernels read the parameters themselves and there is nothing to rebuild."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for module in linear_layers(model):
        module.quant_method.process_weights_after_loading(module)


def linear_layers(model: nn.Module) -> list[nn.Module]:
    """The layers that multiply by a weight (``LinearBase`` and the LM head): the input embedding is a
    lookup, so its handle (which vLLM builds too) is never used and is not rebuilt."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    return [m for m in model.modules()
            if isinstance(m, (LinearBase, ParallelLMHead)) and getattr(m, "quant_method", None) is not None]


def reload_flat(vllm_config: Any, model: nn.Module, layout: FlatLayout, buffer: torch.Tensor) -> None:
    """vLLM's ``reload_weights`` over the buffer's views, with tied parameters re-tied after it."""
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    ties = tied_parameters(model)
    reload_weights(vllm_config, model, weights_iterator=layout.views(buffer), weights_path=None,
                   is_checkpoint_format=True)
    retie(ties)


def tied_parameters(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module, str]]:
    """``(module, name, owner, owner_name)`` for every parameter that aliases an earlier module's.

    The owner is the first module in registration order, which for HF-style models is the input
    embedding (``model.embed_tokens`` is registered before ``lm_head``): the one checkpoints name.
    """
    owners: dict[int, tuple[nn.Module, str]] = {}
    ties = []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in owners:
                ties.append((module, name, *owners[id(param)]))
            else:
                owners[id(param)] = (module, name)
    return ties


def retie(ties: list[tuple[nn.Module, str, nn.Module, str]]) -> None:
    """Point each alias back at its owner's (freshly loaded) parameter and redo the module's
    post-load processing (on CPU that rebuilds the packed GEMM copy of the weight)."""
    for module, name, owner, owner_name in ties:
        setattr(module, name, getattr(owner, owner_name))
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)
