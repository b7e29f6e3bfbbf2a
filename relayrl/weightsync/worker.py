"""Engine side of weight sync: a vLLM worker extension, called through ``collective_rpc``.

vLLM mixes ``worker_extension_cls`` into its worker class, so ``self`` below is the worker and
``self.model_runner`` its model runner. Loading goes through ``reload_weights`` because the CPU
backend repacks linear weights after loading: a second plain ``model.load_weights`` fails there,
while ``reload_weights`` restores the checkpoint layout, loads, and repacks again.

Tied parameters need one more step. A checkpoint of a tied model names the shared tensor once
(``embed_tokens``); ``reload_weights`` loads that module and, finding nothing for ``lm_head``,
puts lm_head's *old* tensor back, which silently unties it (seen on vLLM 0.32 CPU: logprobs were
off by 0.4 nats after a sync). So aliases are recorded before the reload and re-tied after it.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import torch
from torch import nn

from relayrl.weightsync.base import WeightHandle


class WeightSyncExtension:
    """Methods prefixed ``relayrl_`` so they cannot collide with vLLM's own worker methods."""

    def relayrl_load_weights(self, handle: dict[str, Any], deadline: float) -> dict[str, float]:
        """Load the weights ``handle`` names, unless wall-clock ``deadline`` (``time.time()``) passed.

        The deadline check is why a caller that gave up (``asyncio.wait_for`` timed out) does not
        get its weights swapped later behind its back: a late RPC refuses to touch the model.
        Returns ``{"open_s", "load_s"}``.
        """
        from relayrl.weightsync import BACKENDS

        h = WeightHandle(**handle)
        t0 = time.perf_counter()
        weights = BACKENDS[h.backend].open_weights(h)
        t1 = time.perf_counter()
        if time.time() > deadline:
            raise TimeoutError(f"weights v{h.version} arrived after the caller's deadline; not loaded")
        model = self.model_runner.get_model()
        ties = _tied_parameters(model)
        self.reload_weights(weights_iterator=weights)
        _retie(ties)
        return {"open_s": t1 - t0, "load_s": time.perf_counter() - t1}

    def relayrl_param_digests(self) -> dict[str, str]:
        """sha256 of the raw bytes of every non-empty parameter, by vLLM parameter name.

        For tests: proves a sync is bit-exact. CPU GEMM dispatch may empty a linear layer's
        ``weight`` (it keeps a packed copy elsewhere); those show up as absent here.
        """
        model = self.model_runner.get_model()
        return {name: hashlib.sha256(p.detach().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()
                for name, p in model.named_parameters() if p.numel() > 0}



def _tied_parameters(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module, str]]:
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


def _retie(ties: list[tuple[nn.Module, str, nn.Module, str]]) -> None:
    """Point each alias back at its owner's (freshly loaded) parameter and redo the module's
    post-load processing (on CPU that rebuilds the packed GEMM copy of the weight)."""
    for module, name, owner, owner_name in ties:
        setattr(module, name, getattr(owner, owner_name))
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)
