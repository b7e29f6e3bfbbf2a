"""Tensor parallelism for the trainer: a 2-D ("dp", "tp") device mesh and the decoder layers' TP plan.

Layout (``trainer.world_size = dp x tp``, row-major, so a TP group is ``tp`` consecutive ranks):

    rank = dp_rank * tp + tp_rank          mesh["tp"]: ranks that hold one model's shards (same data)
                                           mesh["dp"]: ranks that see different rows (FSDP2 shards here)

The plan is the one Megatron uses and HF configs ship as ``base_model_tp_plan``: in every decoder
layer q/k/v and gate/up are split by output features (``ColwiseParallel``: each rank computes its heads,
or its slice of the MLP's hidden units), o/down by input features (``RowwiseParallel``: partial sums,
one all-reduce per block). The embedding and the (tied or not) lm_head are split by vocabulary rows, as
Megatron-LM splits them (``split_vocabulary``): a 152k x 3584 head is 2.2 GB of fp32 weights, and a rank
would otherwise keep it and its gradient and moments whole. The head scores through ``vocab_parallel.py``.
Norms stay whole on every TP rank; everything is FSDP-sharded over "dp" as well.

Attention needs no patch (checked against transformers 5.19's Llama/Qwen2 attention): it reshapes
projections with ``view(*input_shape, -1, head_dim)`` and ``reshape(*input_shape, -1)``, so the local
head count follows from the sharded width, and ``num_key_value_groups = heads / kv_heads`` is the same
ratio on every rank as long as both head counts divide by ``tp`` (checked in ``parallelize``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch.distributed.device_mesh import DeviceMesh

if TYPE_CHECKING:
    from transformers import PretrainedConfig

_STYLES = ("colwise", "rowwise")


def build_mesh(device_type: str, world_size: int, tp_size: int, cp_size: int = 1, pp_size: int = 1) -> DeviceMesh:
    """``tp_size == cp_size == pp_size == 1``: the 1-D ("dp",) mesh over all ranks; pipeline stages split by
    tensor parallelism: the 3-D ("dp", "pp", "tp") mesh, tp innermost (a stage's tp ranks are neighbours, as
    Megatron-LM places them within a node); else the 2-D ("dp", "tp"), ("dp", "cp") or ("dp", "pp") mesh,
    row-major as tp's (``TrainerConfig`` checked the sizes divide world_size and which combine)."""
    from torch.distributed.device_mesh import init_device_mesh

    if tp_size == 1 and cp_size == 1 and pp_size == 1:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("dp",))
    if pp_size > 1 and tp_size > 1:
        dp = world_size // (pp_size * tp_size)
        return init_device_mesh(device_type, (dp, pp_size, tp_size), mesh_dim_names=("dp", "pp", "tp"))
    inner, name = (tp_size, "tp") if tp_size > 1 else (cp_size, "cp") if cp_size > 1 else (pp_size, "pp")
    return init_device_mesh(device_type, (world_size // inner, inner), mesh_dim_names=("dp", name))


def shard_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP2 shards over: "dp", or with context parallelism "dp" x "cp" flattened (the cp ranks
    hold different tokens of the same rows, so their gradients are parts of one sum, as dp ranks' are)."""
    if "cp" not in (mesh.mesh_dim_names or ()):
        return mesh["dp"]
    return mesh["dp", "cp"]._flatten("dp_cp")


def layer_plan(config: PretrainedConfig) -> dict[str, str]:
    """The decoder layers' entries (``layers.*``) of the model's ``base_model_tp_plan`` (paths under the
    base model); other entries (e.g. ``embed_tokens``) are left out, so those modules stay replicated.

    Only plain ``colwise``/``rowwise`` styles are understood; anything else in a layer (MoE experts,
    gathered outputs, sequence parallel) is refused rather than guessed.
    """
    full = getattr(config, "base_model_tp_plan", None) or {}
    plan = {k: v for k, v in full.items() if k.startswith("layers.")}
    if not plan:
        raise ValueError(
            f"{type(config).__name__} ships no base_model_tp_plan; trainer.tp_size>1 supports "
            "Llama/Qwen2-style decoders only; set trainer.tp_size=1"
        )
    odd = {k: v for k, v in plan.items() if v not in _STYLES}
    if odd:
        raise ValueError(
            f"{type(config).__name__}'s TP plan has styles relayrl does not apply ({odd}); set trainer.tp_size=1"
        )
    return plan


def check_heads(config: dict, tp_size: int) -> None:
    """Heads and KV heads (``config.json`` keys) must split evenly over the TP ranks: each rank keeps
    whole heads. Called before Ray starts (driver) and again when the model is parallelized."""
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    if heads % tp_size or kv_heads % tp_size:
        raise ValueError(
            f"trainer.tp_size={tp_size} must divide the model's attention heads ({heads}) and "
            f"KV heads ({kv_heads}); pick a tp_size that divides both (or trainer.tp_size=1)"
        )


def check_model(path: str, tp_size: int) -> None:
    """What ``parallelize`` needs of the model at ``path``, from its config alone (the model built on the meta
    device, no weights read): heads that ``tp_size`` divides, a layer plan it applies, and ends it can split by
    vocabulary. The driver calls it before Ray starts; each raises ``ValueError`` naming the fix."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    check_heads(config.to_dict(), tp_size)
    layer_plan(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    check_vocabulary(model, tp_size)


def check_vocabulary(model: torch.nn.Module, tp_size: int) -> None:
    """``split_vocabulary`` splits a plain ``nn.Embedding`` (a subclass may scale or offset its lookups) into
    ``tp_size`` parts of at least one row each."""
    from relayrl.trainer.vocab_parallel import row_offset

    embed = cast(Any, model).get_input_embeddings()
    if type(embed) is not torch.nn.Embedding:
        raise ValueError(
            f"trainer.tp_size={tp_size} splits the embedding by vocabulary, which needs an nn.Embedding; this model "
            f"has {type(embed).__name__}; set trainer.tp_size=1"
        )
    vocab = cast(Any, model).get_output_embeddings().weight.shape[0]
    if row_offset(vocab, tp_size, tp_size - 1) >= vocab:
        raise ValueError(
            f"a vocabulary of {vocab} leaves a tp rank no rows at trainer.tp_size={tp_size}; lower trainer.tp_size"
        )


def parallelize(model: torch.nn.Module, tp_mesh: DeviceMesh) -> torch.nn.Module:
    """Apply the layer plan in place: listed linears become DTensor shards on ``tp_mesh``; inputs and
    outputs of each block stay plain (replicated) tensors, so the rest of the HF model runs unchanged."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    # torch types a Module's attributes as Tensor | Module; an HF model's are its config and base model
    config = cast("PretrainedConfig", model.config)
    check_heads(config.to_dict(), tp_mesh.size())
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {path: styles[style]() for path, style in layer_plan(config).items()}
    parallelize_module(cast(torch.nn.Module, model.base_model), tp_mesh, plan)
    split_vocabulary(model, tp_mesh)
    return model


def split_vocabulary(model: torch.nn.Module, tp_mesh: DeviceMesh) -> None:
    """The embedding and the LM head split by vocabulary rows over ``tp_mesh`` (``Shard(0)`` DTensors, placed by
    torch's ``distribute_module`` without hooks), as Megatron-LM splits them: the embedding looks up its rows'
    tokens and sums the lookups over tp (``vocab_parallel.VocabParallelEmbedding``), and ``head.score`` reads a
    split head as a vocab-parallel one (``vocab_parallel.chunk_stats``). A tied pair stays one parameter."""
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

    from relayrl.trainer.vocab_parallel import VocabParallelEmbedding

    embed: Any = cast(Any, model).get_input_embeddings()
    lm: Any = cast(Any, model).get_output_embeddings()
    check_vocabulary(model, tp_mesh.size())
    tied = embed.weight is lm.weight

    def by_rows(name: str, module: torch.nn.Module, mesh: DeviceMesh) -> None:
        for key, p in list(module.named_parameters(recurse=False)):
            split = distribute_tensor(p.detach(), mesh, [Shard(0)])
            module.register_parameter(key, torch.nn.Parameter(split, requires_grad=p.requires_grad))

    for module in [embed] if tied else [embed, lm]:
        distribute_module(module, tp_mesh, by_rows)
    embed.__class__ = VocabParallelEmbedding
    if tied:
        lm._parameters["weight"] = embed.weight
