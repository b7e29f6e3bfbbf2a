"""Engine side: what relayrl adds to every vLLM worker (``worker_extension_cls``).

vLLM mixes this class into its worker, so ``self`` is the worker. Importing this module (vLLM
does, when it builds the worker, before the model and its weight-transfer engine exist) registers
relayrl's weight-transfer engines in vLLM's factory: that is how ``relayrl_shm`` and
``relayrl_broadcast`` become valid ``weight_transfer_config.backend`` names inside the engine
process, without a plugin entry point that would need the package's install metadata.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import TYPE_CHECKING, Any

import torch

from relayrl.weightsync import register_with_vllm
from relayrl.weightsync.commit import keep_cpu_weights_if_asked

if TYPE_CHECKING:
    from vllm.distributed.weight_transfer.base import WeightTransferEngine

register_with_vllm()
keep_cpu_weights_if_asked()  # before vLLM builds the model: weightsync.commit=inplace needs the CPU linears' weights


class WeightSyncExtension:
    """Methods prefixed ``relayrl_`` so they cannot collide with vLLM's own worker methods."""

    # The vLLM worker's, which this class is mixed into (annotations only: nothing is defined here).
    weight_transfer_engine: WeightTransferEngine | None
    model_runner: Any  # the platform's model runner (CPU or GPU), whose classes share no base type
    _weight_update_active: bool

    def relayrl_abort_weight_update(self) -> None:
        """End an open update without loading anything.

        vLLM's worker has no abort: it clears its session flag only when ``update_weights`` raises,
        so a session whose trainer vanished between start and update would make every later
        ``start_weight_update`` fail. relayrl's engines drop their staged payload here (the model
        was never touched); vLLM's own engines load in place and have nothing to drop.
        """
        engine = self.weight_transfer_engine
        if engine is not None:
            if hasattr(engine, "abort_weight_update"):
                engine.abort_weight_update()
            engine.reset_weight_update_target()
        self._weight_update_active = False

    def relayrl_cpu_binding(self) -> dict[str, Any]:
        """The worker's cores (this thread's affinity, which the OpenMP threads it starts inherit), torch's
        thread count and its pid. For tests: a worker forked from relayrl's forkserver is bound as a spawned
        one is (``rollout/forkserver.py``)."""
        return {"cpus": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(), "pid": os.getpid()}

    def relayrl_modules_loaded(self, names: list[str]) -> list[bool]:
        """Which of ``names`` this worker has imported. For tests: an eager CPU engine never imports Inductor's
        compiler (``relayrl.vllm_import``)."""
        return [name in sys.modules for name in names]

    def relayrl_param_digests(self) -> dict[str, str]:
        """sha256 of the raw bytes of every non-empty parameter, by vLLM parameter name.

        For tests: proves a sync is bit-exact. CPU GEMM dispatch may empty a linear layer's
        ``weight`` (it keeps a packed copy elsewhere; not with ``weightsync.commit=inplace``); those show
        up as absent here.
        """
        model = self.model_runner.get_model()
        return {
            name: hashlib.sha256(p.detach().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()
            for name, p in model.named_parameters()
            if p.numel() > 0
        }
