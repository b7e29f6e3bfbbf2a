"""Under pipeline parallelism each rank keeps only its own stages' weights; the whole policy is read one parameter
at a time.

``load_stages`` builds the HF model on the meta device and reads from its safetensors only the weights of this
rank's stages; every other parameter stays a frozen tensor on the meta device: the same name, shape and dtype
(and, under tensor parallelism, the same DTensor mesh and placements), no storage. A rank holds its L / P layers,
plus the embedding on the first stage and the final norm and LM head on the last, at load and after. Frozen, the
stand-ins are what the optimizer (built after) and the checkpoints leave out (``checkpoint.TRAINED_ONLY``): each
rank writes and reads its own stages' weights and AdamW moments under the model's names, and DCP reshards them to
any other layout.

With data-parallel replicas of the stages (world_size > pp_size x tp_size), ``shard_stages`` shards each rank's
decoder layers and ends (embedding, LM head) over them with FSDP2, so a replica keeps 1/dp of its weights, gradients
and AdamW moments but the final norm. Under tensor parallelism too: a tp-split linear becomes a 2-D DTensor over
("dp", "tp"), each rank keeping 1/dp of its tp shard, as torchtitan composes FSDP2 with TP.

The readers of the whole policy (weight sync's single sender, ``save_hf``, the trainer's state dict, all on rank 0)
take ``gathered``: in ``named_parameters`` order, each parameter made whole by the ranks of the stage holding it
(``full_tensor`` over dp and tp), then sent from the first pipeline rank holding it (``owners``) to rank 0, point
to point, one parameter at a time, as vLLM's ``ModuleSource`` gathers FSDP2 shards. A rank never
holds more than its stages and one whole parameter. ``weightsync/stages.py``'s ``StageSource`` is that order as a
vLLM ``WeightSource``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from relayrl.trainer.pipeline import build_stages, device_of, stage_ids


def owners(model: torch.nn.Module, pp_size: int, virtual: int = 1) -> dict[str, int]:
    """Each parameter's name (``named_parameters``'; a tied LM head is the embedding) -> the first pipeline rank
    whose stages hold it."""
    out: dict[str, int] = {}
    for rank in range(pp_size):
        for stage in build_stages(model, rank, pp_size, virtual):
            for name, _ in stage.named_parameters():
                out.setdefault(stage.global_name(name), rank)
    return out


def load_stages(
    model_path: str,
    device: torch.device,
    pp_rank: int,
    pp_size: int,
    virtual: int = 1,
    checkpoint_every: int = 0,
    tp_mesh: DeviceMesh | None = None,
    dp_mesh: DeviceMesh | None = None,
) -> torch.nn.Module:
    """The HF causal LM as pipeline stages train it (float32 master weights, the chunked head, relayrl's attention,
    the decoder linears split over ``tp_mesh`` when given, every ``checkpoint_every``-th layer checkpointed, eval
    mode), with only pipeline rank ``pp_rank``'s stages read from disk: the model is built on the meta device, its
    stages' weights are read one tensor at a time from the safetensors files (float32, on ``device``), and every
    other weight stays a frozen meta stand-in. No rank ever holds the whole model, at load or after. With a
    ``dp_mesh`` of more than one rank, the decoder layers and the ends are then sharded over it, after the tp split
    (``shard_stages``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from relayrl.trainer import head
    from relayrl.trainer.attention import use_packed_attention
    from relayrl.trainer.precision import keep_head_fp32
    from relayrl.trainer.recompute import checkpoint_layers
    from relayrl.trainer.tp import parallelize

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    use_packed_attention(model)
    wanted = {id(p) for stage in build_stages(model, pp_rank, pp_size, virtual) for p in stage.parameters()}
    names = {name: p for name, p in model.named_parameters() if id(p) in wanted}
    loaded = {id(p): torch.nn.Parameter(t.to(device, torch.float32)) for p, t in _read(model_path, names)}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and id(p) in loaded:  # a tied pair: both names get the one loaded tensor
                module._parameters[name] = loaded[id(p)]
    for p in model.parameters():
        if p.is_meta:  # another rank's: a frozen stand-in
            p.requires_grad_(False)
    _rebuild_buffers(model, device)
    keep_head_fp32(head.install(model.get_output_embeddings()))
    if tp_mesh is not None:
        parallelize(model, tp_mesh)
    checkpoint_layers(model, checkpoint_every)
    if dp_mesh is not None and dp_mesh.size() > 1:
        ids = stage_ids(pp_rank, pp_size, virtual)
        shard_stages(model, dp_mesh, first=0 in ids, last=pp_size * virtual - 1 in ids)
    return model.eval()


def shard_stages(model: torch.nn.Module, mesh: DeviceMesh, first: bool, last: bool) -> None:
    """FSDP2 over ``mesh`` (the dp replicas of this rank's stages): each decoder layer this rank holds is one unit,
    and so are the embedding if it holds the ``first`` stage and the LM head if the ``last``. A unit is gathered for
    its forward and again for its backward, and its gradient averaged over ``mesh`` by a reduce-scatter (the caller
    scales the loss by the replicas); the loss calls the head's own forward (``head.head_scores``) so that FSDP2
    gathers it. Each unit is its own root (no FSDP2 module holds a stage), so ``reshard_after_forward`` is set:
    FSDP2 keeps a root's weights whole from forward to backward by default. The final norm (H floats) stays whole
    on each replica, its gradient averaged by ``PipelinedPolicy``. The other stages' meta stand-ins stay as they are.

    A tied embedding is one parameter under two modules, and only one of them runs on a rank (the first and the
    last stage are on different ranks when pp > 1): that one is sharded, and the other module is given its sharded
    parameter, so that ``named_parameters`` still yields it once."""
    from torch.distributed.fsdp import fully_shard

    if first and last:
        raise ValueError("FSDP2 pipeline stages need trainer.pp_size > 1: one rank holds both ends")
    inner = cast(Any, model).model
    embed, lm = inner.embed_tokens, cast(Any, model).get_output_embeddings()
    tied = embed.weight is lm.weight  # before sharding gives the ends parameters of their own
    ends = [embed] if first else [lm] if last else []
    for unit in [layer for layer in inner.layers if not _meta(layer)] + ends:
        fully_shard(unit, mesh=mesh, reshard_after_forward=True)
    if ends and tied:
        other = lm if first else embed
        other._parameters["weight"] = ends[0].weight


def _meta(module: torch.nn.Module) -> bool:
    return any(p.is_meta for p in module.parameters())


def _read(model_path: str, params: dict[str, torch.Tensor]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(parameter, its tensor read from ``model_path``'s safetensors) for each named parameter: only those
    tensors' bytes are read."""
    import json
    from pathlib import Path

    from safetensors import safe_open

    root = Path(model_path)
    index = root / "model.safetensors.index.json"
    single = dict.fromkeys(params, "model.safetensors")
    files = json.loads(index.read_text())["weight_map"] if index.exists() else single
    missing = f"; trainer.pp_size reads each stage's weights from {model_path}'s HF safetensors files"
    for name, p in params.items():
        if name not in files or not (root / files[name]).exists():
            raise ValueError(f"no weight {name!r} in a safetensors file{missing}")
        with safe_open(str(root / files[name]), framework="pt", device="cpu") as f:
            present = f.keys()
            if name not in present:
                raise ValueError(f"no weight {name!r} in {files[name]}{missing}")
            yield p, f.get_tensor(name)


def _rebuild_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Modules whose buffers were built on meta (the rotary embedding's inverse frequencies) built again from their
    config on ``device``; any other meta buffer is refused by name."""
    for parent in list(model.modules()):
        for child_name, child in parent.named_children():
            if any(b.is_meta for b in child.buffers(recurse=False)) and hasattr(child, "config"):
                setattr(parent, child_name, type(child)(child.config).to(device))
    left = [name for name, b in model.named_buffers() if b.is_meta]
    if left:
        raise ValueError(f"pipeline stages cannot rebuild the model's buffers {left}; set trainer.pp_size=1")


def held(model: torch.nn.Module) -> dict[str, int]:
    """The parameters this rank holds (not meta stand-ins), by name: the elements it keeps of each (its shard's,
    under FSDP2 or tensor parallelism)."""
    params = ((n, p.to_local() if isinstance(p, DTensor) else p) for n, p in model.named_parameters())
    return {n: p.numel() for n, p in params if not p.is_meta}


def gathered(
    model: torch.nn.Module, owner: dict[str, int], group: dist.ProcessGroup
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) of every parameter, in ``named_parameters`` order, on global rank 0 (the one that sends
    or saves them): made whole by its stage's ranks when split over tp or sharded over dp (``full_tensor``), then
    sent there point to point from the stage's rank in rank 0's pipeline ``group``. The other ranks take part in
    their stage's gathers and yield their own whole tensor, or another stage's meta stand-in; the other pipelines
    (dp or tp index > 0) send nothing. Collective, one parameter at a time."""
    me, first = dist.get_rank(group), dist.get_global_rank(group, 0)
    sends = first == 0  # only rank 0's pipeline: the others' copies would be thrown away
    for name, p in model.named_parameters():
        if p.is_meta:  # another stage's: its stand-in (a first rank receives it below)
            whole = p.detach()
        elif isinstance(p, DTensor):  # split over tp or sharded over dp: gathered by the stage's ranks (all hold it)
            whole = p.full_tensor().detach()
        else:
            whole = p.detach()
        if sends and owner[name] != 0 and me == 0:
            whole = torch.empty(p.shape, dtype=p.dtype, device=device_of(model))
            dist.recv(whole, src=dist.get_global_rank(group, owner[name]), group=group)
        elif sends and owner[name] != 0 and me == owner[name]:
            dist.send(whole, dst=first, group=group)
        yield name, whole


def own(model: torch.nn.Module, owner: dict[str, int], pp_rank: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) of the parameters pipeline rank ``pp_rank`` owns (``owners``), in ``named_parameters``
    order, on every rank of that stage: made whole over dp and tp (``full_tensor``, collective among the stage's
    ranks), never sent to another stage. What a stage writes itself into a shared weight buffer
    (``weightsync/shm.py``)."""
    for name, p in model.named_parameters():
        if owner[name] == pp_rank:
            yield name, (p.full_tensor() if isinstance(p, DTensor) else p).detach()


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
