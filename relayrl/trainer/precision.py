"""``trainer.dtype=bf16``: bf16 compute under autocast, float32 everywhere precision is cheap to keep.

What runs in which dtype (CPU and CUDA alike):

    master weights, gradients, AdamW moments     float32   (parameters are never cast in place)
    decoder linears / matmuls                     bfloat16  (autocast's op list; oneDNN AVX512-BF16 on CPU)
    norms, rotary tables, residual stream         float32   (HF upcasts them; bf16 + fp32 promotes to fp32)
    LM head (logits)                              float32   (``keep_head_fp32``: a bf16 logit carries an
                                                             absolute error ~|z| / 256, i.e. ~0.05 nats on
                                                             logits of ~10, straight into every logprob)
    logprobs, losses, normalisers                 float32   (computed from float32 logits)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

DTYPES = ("float32", "bf16")


@contextlib.contextmanager
def autocast(device_type: str, dtype: str) -> Iterator[None]:
    """``torch.autocast`` to bfloat16 when ``dtype == "bf16"``, else nothing."""
    if dtype not in DTYPES:
        raise ValueError(f"trainer.dtype={dtype!r} is not one of {DTYPES}")
    with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
        yield


def keep_head_fp32(head: torch.nn.Module) -> None:
    """Run ``head`` (an output projection) in float32 even inside autocast.

    Forward hooks rather than a wrapper module: the model's parameter names (what checkpoints, weight
    sync and ``save_hf`` use) stay exactly the HF ones. Outside autocast both hooks do nothing. Autocast
    only changes forward kernels, so switching it off for this one call leaves backward untouched.
    """

    was_enabled = False  # autocast's state when this head's forward began, restored after it

    def before(module: torch.nn.Module, args: tuple) -> tuple:
        nonlocal was_enabled
        device = args[0].device.type
        was_enabled = torch.is_autocast_enabled(device)
        if not was_enabled:
            return args
        torch.set_autocast_enabled(device, False)
        return (args[0].float(), *args[1:])

    def after(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        if was_enabled:
            torch.set_autocast_enabled(args[0].device.type, True)

    head.register_forward_pre_hook(before)
    head.register_forward_hook(after)
