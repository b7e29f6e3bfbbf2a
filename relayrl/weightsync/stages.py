"""The weights a pipelined trainer sends (``trainer.pp_size`` > 1): each rank holds only its own stages
(``trainer/pp_weights.py``), so a sync gathers the whole policy one parameter at a time, each broadcast from the
pipeline rank that holds it, in the order and under the names the engines expect."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

from relayrl.trainer.pp_weights import gathered


class StageSource(WeightSource):
    """vLLM's ``WeightSource`` over a pipelined policy whose ranks hold only their stages: ``gathered``'s order
    and tensors; ``metadata`` reads the global shapes (the meta tensors keep them) without a gather."""

    def __init__(self, model: torch.nn.Module, owner: dict[str, int], group: dist.ProcessGroup) -> None:
        self._model, self._owner, self._group = model, owner, group

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, p.dtype, tuple(p.shape)) for name, p in self._model.named_parameters()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return gathered(self._model, self._owner, self._group)
