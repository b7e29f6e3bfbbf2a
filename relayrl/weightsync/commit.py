"""Commit: load a verified flat buffer into a vLLM model, the only place an engine's weights change.

Two paths (``weightsync.commit``):

``inplace`` (default)  ``model.load_weights`` copies every tensor into the parameter it already has
    (vLLM's weight loaders narrow fused ``qkv_proj`` / ``gate_up_proj`` and copy in place, as vLLM's own
    NCCL engine does on GPU), then, on CPU, each linear layer's packed GEMM copy is rebuilt from its
    parameter (``repack``). On CPU vLLM normally *drops* a linear's weight once its oneDNN handle holds a
    reordered copy, which leaves nothing to copy into; ``keep_cpu_weights`` (run in the engine's
    processes before the model is built) keeps it. Gain: no re-allocation of every parameter (fresh pages,
    faulted in on first write) and no re-processing of layers without weights.
    On CPU most linears skip the copy altogether: when the checkpoint tensors a linear fuses lie end to
    end in the buffer in its dtype (a trainer sends them in module order, so q/k/v and gate/up are
    adjacent), the packed copy is built straight from the buffer and the parameter emptied
    (``direct_sources``, ``pack_direct``); a later layout that needs the copy re-allocates it
    (``restore_weight``). SmolLM2: all 120 linears, 425 of the 538 MB, are never copied.
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
from itertools import pairwise
from typing import Any, TypeGuard

import torch
from torch import nn

from relayrl.weightsync.layout import FlatLayout, Slot, dtype_name, to_dtype
from relayrl.weightsync.names import KEEP_ENV

Layer = Any
"""A vLLM linear or LM head. Its ``weight`` (a registered parameter) and ``quant_method`` are set as the model
loads; torch's ``nn.Module`` stub types such attributes as ``Tensor | Module``, so layers are duck-typed here."""


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

    dispatch.__dict__["relayrl_keeps_weight"] = True  # marks the patch, so a second call leaves it
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
    """Unquantized weights whose every linear holds its parameter (``keep_cpu_weights`` ran on CPU) or gave it
    up for a packed copy built straight from the buffer (``pack_direct``, which records its shape)."""
    if vllm_config.model_config.quantization is not None:
        return False
    return all(m.weight.numel() > 0 or hasattr(m, DROPPED_SHAPE) for m in linear_layers(model) if hasattr(m, "weight"))


def load_in_place(model: nn.Module, layout: FlatLayout, buffer: torch.Tensor) -> None:
    """Copy every tensor into the parameter that holds it, then rebuild the CPU GEMM copies.

    On CPU a linear whose checkpoint tensors lie end to end in the buffer (``direct_sources``) skips the copy:
    its packed copy is built straight from the buffer's bytes and its parameter is emptied, as vLLM itself
    does after loading. That saves one pass over the linear weights per sync (SmolLM2: 425 of 538 MB) and
    the engine's spare copy of them. The rest (embeddings, norms, the tied LM head, any linear whose bytes
    are not one run, e.g. a bf16 payload for an fp32 engine) is copied and repacked as before."""
    direct = direct_sources(model, layout) if packs_a_copy() else {}
    covered = {slot.name for slots in direct.values() for slot in slots}
    copied = [m for m in linear_layers(model) if m not in direct]
    for module in copied:
        restore_weight(module)
    # operator: vLLM models define load_weights; nn.Module's stub types an unknown attribute as Tensor | Module
    model.load_weights((name, view) for name, view in layout.views(buffer) if name not in covered)  # type: ignore[operator]
    for module, slots in direct.items():
        pack_direct(module, fused_view(buffer, slots))
    repack(copied)


DROPPED_SHAPE = "relayrl_dropped_shape"
"""Set on a linear whose weight ``pack_direct`` emptied: the shape to re-allocate should a later version
arrive in a layout that needs the copy (``restore_weight``)."""


def direct_sources(model: nn.Module, layout: FlatLayout) -> dict[Layer, list[Slot]]:
    """Unquantized, unsharded linears whose weight is one run of the layout: the checkpoint tensors vLLM fuses
    into it (``packed_modules_mapping``: q/k/v -> qkv_proj, gate/up -> gate_up_proj), end to end in that
    order, in the parameter's dtype, stacking to its shape."""
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

    slots = {slot.name: slot for slot in layout.slots}
    fused = getattr(model, "packed_modules_mapping", {}) or {}
    out: dict[Layer, list[Slot]] = {}
    for name, module in model.named_modules():
        if (
            not isinstance(module, LinearBase)
            or not isinstance(module.quant_method, UnquantizedLinearMethod)
            or getattr(module, "_cpu_skip_gemm_dispatch", False)
        ):  # F.linear on the weight itself
            continue
        parent, _, leaf = name.rpartition(".")
        parts = [
            slots.get(f"{parent}.{shard}.weight" if parent else f"{shard}.weight") for shard in fused.get(leaf, [leaf])
        ]
        if getattr(module, "tp_size", 1) == 1 and is_run(parts, weight_shape(module), module.params_dtype):
            out[module] = parts
    return out


def is_run(parts: list[Slot | None], shape: tuple[int, int], dtype: torch.dtype) -> TypeGuard[list[Slot]]:
    """``parts`` are 2-D slots of ``dtype``, each starting where the last ends, stacking to ``shape``."""
    slots = [p for p in parts if p is not None]
    if not slots or len(slots) < len(parts) or any(len(p.shape) != 2 or p.dtype != dtype_name(dtype) for p in slots):
        return False
    ends_meet = all(a.offset + a.nbytes == b.offset for a, b in pairwise(slots))
    stacked = (sum(p.shape[0] for p in slots), slots[0].shape[1])
    return ends_meet and all(p.shape[1] == shape[1] for p in slots) and stacked == tuple(shape)


def weight_shape(module: Layer) -> tuple[int, int]:
    return tuple(module.weight.shape) if module.weight.numel() > 0 else getattr(module, DROPPED_SHAPE, (0, 0))


def fused_view(buffer: torch.Tensor, parts: list[Slot]) -> torch.Tensor:
    """The stacked weight ``parts`` hold, as one view of ``buffer`` (no copy)."""
    start, end = parts[0].offset, parts[-1].offset + parts[-1].nbytes
    return buffer[start:end].view(to_dtype(parts[0].dtype)).view(-1, parts[0].shape[1])


def pack_direct(module: Layer, weight: torch.Tensor) -> None:
    """Build ``module``'s packed GEMM copy from ``weight`` (a view of the buffer), then empty its parameter:
    the packed copy is all the CPU kernel reads, and the buffer will hold the next version."""
    shape = weight_shape(module)
    module.weight.data = weight
    module.quant_method.process_weights_after_loading(module)
    module.weight.data = weight.new_empty(0)
    setattr(module, DROPPED_SHAPE, shape)


def restore_weight(module: Layer) -> None:
    """Give an emptied linear its parameter back (uninitialised: the load that follows fills it)."""
    if module.weight.numel() == 0 and hasattr(module, DROPPED_SHAPE):
        module.weight.data = module.weight.new_empty(getattr(module, DROPPED_SHAPE))


def packs_a_copy() -> bool:
    """vLLM's CPU GEMM dispatch packs a copy of the weight (oneDNN) rather than keeping a reference to it
    (zentorch's unpacked path, the ``F.linear`` fallback): only then may the weight be a view of the buffer."""
    from vllm import _custom_ops as ops
    from vllm.platforms import CpuArchEnum, current_platform

    return (
        current_platform.is_cpu()
        and bool(ops._supports_onednn)
        and not current_platform.is_zen_cpu()
        and current_platform.get_cpu_architecture() != CpuArchEnum.POWERPC
    )


def _is_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def repack(layers: list[Layer]) -> None:
    """CPU: rebuild each of ``layers``' packed GEMM copy (oneDNN handle) from its updated parameter.
    Elsewhere the kernels read the parameters themselves and there is nothing to rebuild."""
    if not _is_cpu():
        return
    for module in layers:
        module.quant_method.process_weights_after_loading(module)


def linear_layers(model: nn.Module) -> list[Layer]:
    """The layers that multiply by a weight (``LinearBase`` and the LM head): the input embedding is a
    lookup, so its handle (which vLLM builds too) is never used and is not rebuilt."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    return [
        m
        for m in model.modules()
        if isinstance(m, (LinearBase, ParallelLMHead)) and getattr(m, "quant_method", None) is not None
    ]


def reload_flat(vllm_config: Any, model: nn.Module, layout: FlatLayout, buffer: torch.Tensor) -> None:
    """vLLM's ``reload_weights`` over the buffer's views, with tied parameters re-tied after it."""
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    ties = tied_parameters(model)
    reload_weights(
        vllm_config, model, weights_iterator=layout.views(buffer), weights_path=None, is_checkpoint_format=True
    )
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
