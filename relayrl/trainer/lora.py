"""LoRA through PEFT: adapters on the policy's linears, and the merged model under the base model's names.

``wrap`` puts PEFT's LoRA layers into the HF model before FSDP2 shards it; only the adapters keep
``requires_grad``, so the optimizer (and its AdamW moments, and the checkpoint) holds only them. PEFT
renames what it wraps::

    model.layers.0.self_attn.q_proj.weight                           (HF: what vLLM and export take)
    base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight   W  [out, in]   frozen
    base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight  A  [r, in]   trained
    base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight  B  [out, r]  trained (zero at start)

and computes ``y = x W^T + scale * (x A^T) B^T`` with ``scale = alpha / r``, which is ``x (W + scale B A)^T``.
``merge_stream`` turns PEFT-named tensors back into HF-named ones with each adapted weight merged
(``merge_weight``: a new tensor, the trainer's W is never changed), so the engines, ``save_hf`` and the
sync's layout see exactly the base model's parameter names and shapes.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, cast

import torch

from relayrl.config import ConfigError, LoraConfig
from relayrl.trainer import head

if TYPE_CHECKING:
    from peft import PeftModel

ADAPTER = "default"
"""PEFT's name for the one adapter relayrl trains."""
PEFT_PREFIX = "base_model.model."
"""What ``PeftModel`` puts before every HF name."""
_PARTS = {f".lora_A.{ADAPTER}.weight": "A", f".lora_B.{ADAPTER}.weight": "B"}


def wrap(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """``model`` with LoRA adapters of rank ``cfg.r`` on ``cfg.target_modules`` (PEFT's ``get_peft_model``;
    the base weights frozen). Raises ``ConfigError`` when no module matches, or a match is not a linear or
    has a tied weight (``merge_stream`` sees a tied weight once, under its first name)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.layer import Linear

    peft_cfg = PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # PEFT annotates it int; it only divides it by r
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
    )
    try:
        model = get_peft_model(model, peft_cfg)
    except ValueError as exc:
        raise ConfigError(
            f"trainer.lora.target_modules={list(cfg.target_modules)} matches no layer of this model "
            f"({str(exc).splitlines()[0][:120]}); name its linears, e.g. [q_proj,v_proj]"
        ) from None
    other = [n for n, m in model.named_modules() if isinstance(m, LoraLayer) and not isinstance(m, Linear)]
    if other:
        raise ConfigError(
            f"trainer.lora.target_modules matches {other[0]!r}, not a linear layer; relayrl merges "
            "LoRA into linear weights only: name linears, e.g. [q_proj,v_proj]"
        )
    uses = collections.Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    tied = [n for n, m in model.named_modules() if isinstance(m, LoraLayer) and uses[id(m.base_layer.weight)] > 1]
    if tied:
        raise ConfigError(
            f"trainer.lora.target_modules matches {hf_name(tied[0])!r}, whose weight is tied to "
            "another layer (the embeddings): a merge would change both; leave it out"
        )
    adapted_head = head.lm_head(model)
    if isinstance(adapted_head, Linear) and isinstance(adapted_head.base_layer, head.ScoringHead):
        adapted_head.__class__ = _scoring_lora_head()  # type: ignore[assignment]  # a subclass of Linear
    return model


@functools.cache
def _scoring_lora_head() -> type[torch.nn.Module]:
    """PEFT's LoRA ``Linear`` around a ``head.ScoringHead``: while the head scores, it scores with the
    merged ``W + scale B A`` (exact: ``x W^T + scale (x A^T) B^T = x (W + scale B A)^T``; dropout is 0,
    ``LoraConfig`` checks), so the chunked head never holds [N, V] logits here either, and the gradient
    reaches A and B through the merge. A class made on first use: PEFT is imported only with LoRA on."""
    from peft.tuners.lora.layer import Linear

    class ScoringLoraHead(Linear):
        def forward(self, x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
            base = cast(head.ScoringHead, self.base_layer)
            if base.request is None or self.disable_adapters or self.merged:
                return super().forward(x, *args, **kwargs)
            with torch.autocast(x.device.type, enabled=False):  # the head is float32 (keep_head_fp32)
                weight = base.weight.float()
                for name in self.active_adapters:
                    if name in self.lora_A:
                        a, b = (cast(torch.nn.Linear, m[name]).weight.float() for m in (self.lora_A, self.lora_B))
                        weight = weight + self.scaling[name] * (b @ a)
                return base.scores(x, weight)

    return ScoringLoraHead


def scales(model: torch.nn.Module) -> dict[str, float]:
    """HF module name of every adapted linear -> its scale (PEFT's ``scaling``: alpha / r)."""
    from peft.tuners.lora import LoraLayer

    return {hf_name(name): m.scaling[ADAPTER] for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def hf_name(peft_name: str) -> str:
    """``base_model.model.model.layers.0.q_proj.base_layer.weight`` -> ``model.layers.0.q_proj.weight``."""
    return peft_name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


@torch.no_grad()
def merge_weight(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float) -> torch.Tensor:
    """``W + scale * B @ A`` (W [out, in], A [r, in], B [out, r]), computed in float32, returned in W's dtype
    as a new tensor: ``weight`` is not modified."""
    return (weight.float() + scale * (lora_b.float() @ lora_a.float())).to(weight.dtype)


def merge_stream(
    named: Iterable[tuple[str, torch.Tensor]], scale_of: dict[str, float]
) -> Iterator[tuple[str, torch.Tensor]]:
    """PEFT-named tensors in, HF-named tensors out: each adapted linear's W, A and B become one merged
    ``<module>.weight``, yielded once its last part has arrived (PEFT lists A and B right after the base
    layer, so at most one layer is held); every other tensor passes through renamed, in order.
    ``scale_of``: ``scales(model)``. Raises if a layer's parts never all arrive."""
    held: dict[str, dict[str, torch.Tensor]] = {}
    for peft_name, tensor in named:
        name = hf_name(peft_name)
        module, part = _adapter_part(name)
        if part is None and name.endswith(".weight") and name[: -len(".weight")] in scale_of:
            module, part = name[: -len(".weight")], "W"
        if part is None:
            yield name, tensor
            continue
        parts = held.setdefault(module, {})
        parts[part] = tensor
        if len(parts) == 3:
            del held[module]
            yield f"{module}.weight", merge_weight(parts["W"], parts["A"], parts["B"], scale_of[module])
    if held:
        raise ValueError(f"LoRA layers missing a part (base weight, lora_A or lora_B): {sorted(held)}")


def _adapter_part(name: str) -> tuple[str, str | None]:
    """``x.q_proj.lora_A.default.weight`` -> (``x.q_proj``, ``A``); anything else -> (name, None)."""
    for suffix, part in _PARTS.items():
        if name.endswith(suffix):
            return name[: -len(suffix)], part
    return name, None


def adapters_off(model: torch.nn.Module) -> AbstractContextManager:
    """Run the base model (adapters bypassed): the frozen reference for the KL term, without a second copy."""
    return cast("PeftModel", model).disable_adapter()  # a model ``wrap`` made


def param_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts of the whole model (global shapes, whatever the sharding)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def summary_line(model: torch.nn.Module, cfg: LoraConfig) -> str:
    """What a LoRA run trains, printed once by rank 0."""
    n_train, n_all = param_counts(model)
    return (
        f"relayrl: LoRA r={cfg.r} alpha={cfg.alpha:g}: trainer trains {n_train:,} of {n_all:,} parameters "
        f"({100 * n_train / n_all:.2f}%); AdamW state for those only"
    )


def is_peft(model: torch.nn.Module) -> bool:
    """Whether ``model`` is PEFT-wrapped (``wrap``)."""
    return hasattr(model, "peft_config")
