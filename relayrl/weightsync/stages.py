"""The weights a pipelined trainer sends (``trainer.pp_size`` > 1): each rank holds only its own stages
(``trainer/pp_weights.py``).

``StageSource`` is vLLM's ``WeightSource`` over such a policy in two forms:
- iterated (``gathered``): the whole policy one parameter at a time on rank 0, each sent there from the pipeline
  rank that holds it, in the order and under the names the engines expect; what ``broadcast`` (one sender,
  rank 0) sends;
- ``own()``: only the parameters this rank's stages own, made whole within the stage and never sent to another
  stage; ``shm`` and ``pull`` have each stage write those into the shared buffer (or the store's draft) itself,
  and rank 0 stamps (or publishes) the version once every stage has written (``ShmTrainerEngine``,
  ``PullTrainerEngine``)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

from relayrl.trainer.pp_weights import gathered, own


class StageSource(WeightSource):
    """vLLM's ``WeightSource`` over a pipelined policy whose ranks hold only their stages: ``gathered``'s order
    and tensors; ``metadata`` reads the global shapes (the meta tensors keep them) without a gather."""

    def __init__(self, model: torch.nn.Module, owner: dict[str, int], group: dist.ProcessGroup) -> None:
        self._model, self._owner, self.stage_group = model, owner, group

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, p.dtype, tuple(p.shape)) for name, p in self._model.named_parameters()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return gathered(self._model, self._owner, self.stage_group)

    def own(self) -> Iterator[tuple[str, torch.Tensor]]:
        """This pipeline rank's own parameters, whole (collective among its stage's ranks)."""
        return own(self._model, self._owner, dist.get_rank(self.stage_group))

    @property
    def writes(self) -> bool:
        """Whether this rank writes its stage's weights: the first rank of each stage (dp and tp index 0), the
        pipeline ranks of global rank 0, which sends."""
        return dist.get_global_rank(self.stage_group, 0) == 0
