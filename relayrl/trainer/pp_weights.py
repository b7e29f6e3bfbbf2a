"""Under pipeline parallelism each rank keeps only its own stages' weights; the whole policy is read one parameter
at a time.

``release`` turns every parameter outside this rank's stages into a frozen tensor on the meta device: the same
name, shape and dtype (and, under tensor parallelism, the same DTensor mesh and placements), no storage. A rank
then holds its L / P layers, plus the embedding on the first stage and the final norm and LM head on the last,
instead of the whole model. Frozen, the released weights are what the optimizer (built after) and the checkpoints
leave out (``checkpoint.TRAINED_ONLY``): each rank writes and reads its own stages' weights and AdamW moments under
the model's names, and DCP reshards them to any other layout.

The readers of the whole policy (weight sync, ``save_hf``, the trainer's state dict) take ``gathered``: in
``named_parameters`` order, each parameter broadcast from the first pipeline rank holding it (``owners``) to the
others of its pipeline, and a tensor-parallel one then all-gathered over tp (``full_tensor``), one parameter at a
time, as vLLM's ``ModuleSource`` gathers FSDP2 shards. A rank never holds more than its stages and one whole
parameter. ``weightsync/stages.py``'s ``StageSource`` is that order as a vLLM ``WeightSource``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from relayrl.trainer.pipeline import build_stages, device_of


def owners(model: torch.nn.Module, pp_size: int, virtual: int = 1) -> dict[str, int]:
    """Each parameter's name (``named_parameters``'; a tied LM head is the embedding) -> the first pipeline rank
    whose stages hold it."""
    out: dict[str, int] = {}
    for rank in range(pp_size):
        for stage in build_stages(model, rank, pp_size, virtual):
            for name, _ in stage.named_parameters():
                out.setdefault(stage.global_name(name), rank)
    return out


def _meta_like(p: torch.Tensor) -> torch.nn.Parameter:
    """A frozen parameter with ``p``'s shape, dtype and DTensor layout, and no storage."""
    if isinstance(p, DTensor):
        local = torch.empty_like(p.to_local(), device="meta")
        meta: torch.Tensor = DTensor.from_local(
            local, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
        )
    else:
        meta = torch.empty_like(p, device="meta")
    return torch.nn.Parameter(meta, requires_grad=False)


@torch.no_grad()
def release(model: torch.nn.Module, pp_rank: int, pp_size: int, virtual: int = 1) -> int:
    """Every parameter outside pipeline rank ``pp_rank``'s stages replaced by ``_meta_like`` (a tied pair stays
    one object); returns the bytes freed."""
    held = {id(p) for stage in build_stages(model, pp_rank, pp_size, virtual) for p in stage.parameters()}
    replaced: dict[int, torch.nn.Parameter] = {}
    freed = 0
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or id(p) in held or p.is_meta:
                continue
            if id(p) not in replaced:
                replaced[id(p)] = _meta_like(p)
                local = p.to_local() if isinstance(p, DTensor) else p
                freed += local.numel() * local.element_size()
            module._parameters[name] = replaced[id(p)]
    return freed


def held(model: torch.nn.Module) -> list[str]:
    """The names of the parameters this rank holds (not released)."""
    return [name for name, p in model.named_parameters() if not p.is_meta]


def gathered(
    model: torch.nn.Module, owner: dict[str, int], group: dist.ProcessGroup
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) of every parameter, in ``named_parameters`` order, on every rank of the pipeline
    ``group``: broadcast from its owner, then all-gathered over tp when split. Collective, one parameter at a
    time."""
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        buf = local.detach() if not p.is_meta else torch.empty(local.shape, dtype=local.dtype, device=device_of(model))
        dist.broadcast(buf, src=dist.get_global_rank(group, owner[name]), group=group)
        if isinstance(p, DTensor):
            mesh, placements = p.device_mesh, p.placements
            whole = DTensor.from_local(buf, mesh, placements, run_check=False, shape=p.shape, stride=p.stride())
            yield name, whole.full_tensor()
        else:
            yield name, buf


def full_state_dict(
    model: torch.nn.Module, owner: dict[str, int], group: dist.ProcessGroup, keep: bool
) -> dict[str, torch.Tensor]:
    """The whole policy's CPU state dict under ``model.state_dict()``'s keys (a tied LM head under both of its
    names), kept where ``keep`` (empty elsewhere). Collective."""
    by_id = {id(p): name for name, p in model.named_parameters()}
    aliases: dict[str, list[str]] = {}
    for key, value in model.state_dict(keep_vars=True).items():
        aliases.setdefault(by_id.get(id(value), key), []).append(key)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in gathered(model, owner, group):
        if keep:
            cpu = tensor.detach().to("cpu", copy=True)
            out.update(dict.fromkeys(aliases[name], cpu))
    if keep:  # buffers saved with the model (none in Llama or Qwen2: their rotary inv_freq is not persistent)
        names = {key for keys in aliases.values() for key in keys}
        out.update({k: v.detach().cpu() for k, v in model.state_dict().items() if k not in names and k not in out})
    return out
