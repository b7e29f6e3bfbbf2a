"""The weights a LoRA trainer sends: the merged model ``W + alpha / r * B @ A`` under the base model's names.

The engines then need no LoRA support at all: they receive the same names, shapes and bytes as from a
full-weight trainer (``weightsync/bytes`` is the base model's size), and the trainer's weights are never
changed by the merge (``trainer.lora.merge_weight`` returns a new tensor).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource, materialize_full_tensor

from relayrl.trainer.lora import merge_stream, scales


class MergedLoraSource(WeightSource):
    """A ``WeightSource`` over a PEFT-wrapped (and FSDP2-sharded) policy that yields merged HF weights.

    Like vLLM's ``ModuleSource``, iteration gathers one parameter at a time (``full_tensor``, a collective)
    in ``named_parameters`` order on every rank; ``merge_stream`` holds at most one layer's W, A and B.
    ``metadata`` runs the same merge over meta tensors, so names, shapes and order match iteration exactly
    without a gather.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._scales = scales(model)

    def metadata(self) -> list[ParamMeta]:
        meta = ((n, torch.empty(p.shape, dtype=p.dtype, device="meta")) for n, p in self._model.named_parameters())
        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in merge_stream(meta, self._scales)]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        gathered = ((n, materialize_full_tensor(p)) for n, p in self._model.named_parameters())
        return merge_stream(gathered, self._scales)
