"""The policy as an HF causal LM: loaded into the trainer's mesh, and written back out as an HF directory.

The parameter names stay exactly ``AutoModelForCausalLM``'s throughout (TP and FSDP2 replace tensors in
place; ``keep_head_fp32`` uses hooks, not a wrapper), so what ``export`` writes loads with
``from_pretrained`` and what the trainer syncs is what vLLM's ``load_weights`` takes. The exception is
LoRA (``lora.py``): PEFT renames the wrapped model, and ``hf_state_dict`` merges and renames it back.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch.distributed.device_mesh import DeviceMesh

from relayrl.config import LoraConfig
from relayrl.trainer import head, lora
from relayrl.trainer.attention import use_packed_attention
from relayrl.trainer.fsdp import shard_model
from relayrl.trainer.precision import keep_head_fp32
from relayrl.trainer.tp import parallelize, shard_mesh

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def load_sharded(
    model_path: str,
    device: torch.device,
    mesh: DeviceMesh,
    dtype: str,
    trainable: bool,
    lora_cfg: LoraConfig | None = None,
    checkpoint_every: int = 0,
) -> torch.nn.Module:
    """The HF causal LM with float32 master weights, its lm_head scoring in chunks (``head.py``) and its
    attention per packed span (``attention.py``): decoder linears split over "tp" (``tp.parallelize``,
    when the mesh has a "tp" dimension: tp_size > 1), with ``lora_cfg.r > 0`` wrapped by PEFT (``lora.wrap``:
    only the adapters train), then every ``checkpoint_every``-th layer activation-checkpointed and the model
    sharded per decoder layer over "dp", or dp x cp (``tp.shard_mesh``, ``fsdp.shard_model``); ``dtype`` is
    ``model.dtype`` (the compute and wire dtype of the shards)."""
    from transformers import AutoModelForCausalLM

    # transformers wraps PreTrainedModel.to in functools.wraps, which mypy reads as unbound (self = device)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)  # type: ignore[arg-type]
    keep_head_fp32(head.install(model.get_output_embeddings()))  # trainer.dtype=bf16: the head stays float32
    use_packed_attention(model)
    if "tp" in (mesh.mesh_dim_names or ()):
        parallelize(model, mesh["tp"])
    if trainable and lora_cfg is not None and lora_cfg.r > 0:
        model = lora.wrap(model, lora_cfg)
    return shard_model(model, shard_mesh(mesh), dtype, trainable, checkpoint_every)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full, unsharded CPU state dict of an FSDP2 module, with its HF names. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return cast(dict[str, torch.Tensor], state)  # typed for any state value; a module's are all tensors


def hf_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``full_state_dict`` with HF names; a LoRA model's adapters are merged into their weights
    (``lora.merge_stream``), so the result is a plain ``AutoModelForCausalLM`` state dict. Collective."""
    state = full_state_dict(model)
    return dict(lora.merge_stream(state.items(), lora.scales(model))) if lora.is_peft(model) else state


def pad_token_id(config: PretrainedConfig) -> int:
    """The pad id of an HF config: pad, else (the first) eos, else 0."""
    for tid in (config.pad_token_id, config.eos_token_id, 0):
        if tid is not None:
            return tid[0] if isinstance(tid, list) else int(tid)
    return 0


def export(state: dict[str, torch.Tensor], model_path: str, out_dir: str) -> str:
    """Write ``state`` (a full HF state dict) as an HF model directory: safetensors, config, tokenizer and
    generation config from ``model_path``. Returns ``out_dir``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    model.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(out_dir)
    if (Path(model_path) / "generation_config.json").exists():
        GenerationConfig.from_pretrained(model_path).save_pretrained(out_dir)
    return str(out_dir)
