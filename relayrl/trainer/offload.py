"""Colocated GPUs: move a trainer rank's model and optimizer state off the device while the engines generate.

With ``placement=colocated`` the engines and the trainer share GPUs and take turns. vLLM's ``sleep``
frees the engines' weights and KV cache while the trainer works; this is the other half: the FSDP2
shards (parameters, gradients) and AdamW's moments go to host memory while the engines generate, and come
back before the next train step. FSDP2 keeps its parameters as DTensors registered on the module, so
``Module.to`` moves the local shards (and any gradient with them) in place; AdamW's state tensors are
moved one by one.

On CPU trainers there is nothing to free: the calls return 0 and touch nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[tuple[dict[str, Any], str, torch.Tensor]]:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":  # AdamW keeps `step` on the CPU already
                yield state, key, value


@torch.no_grad()
def move_training_state(
    modules: Sequence[torch.nn.Module], optimizers: Sequence[torch.optim.Optimizer], device: torch.device
) -> int:
    """Move every module's parameters/buffers/grads and every optimizer state tensor to ``device``;
    returns the bytes moved (0 when already there). Frees the device cache after moving off a GPU."""
    moved = 0
    for module in modules:
        for p in module.parameters():
            if p.device != device and not p.is_meta:
                moved += p.numel() * p.element_size()
        # Module._apply moves each parameter's .grad too; a pipelined rank's stand-ins for other stages stay on meta
        module._apply(lambda t: t if t.is_meta else t.to(device))
    for optimizer in optimizers:
        for state, key, value in _optimizer_tensors(optimizer):
            if value.device != device:
                moved += value.numel() * value.element_size()
                state[key] = value.to(device, non_blocking=True)
    if device.type == "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return moved
