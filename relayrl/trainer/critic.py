"""PPO's critic: a value model V(s_t) for every completion token, trained on the trainer's own ranks.

**Model.** ``AutoModelForTokenClassification`` with ``num_labels=1``, loaded from the policy's checkpoint:
the policy's backbone (``LlamaForTokenClassification`` for a Llama policy, ``Qwen2...`` for Qwen2) with a
``Linear(hidden, 1)`` head at every position, as verl's critic. Chosen over a hand-made head on a copy
of the causal LM because
  - it is a standard HF class: any architecture with a ``*ForTokenClassification`` works without
    model-specific code, and the critic saves and loads like any HF model;
  - it has no LM head: no ``[V, H]`` projection, no ``[B, L, V]`` logits (the costliest part of the
    policy's forward and of its memory);
  - its backbone loads from the policy checkpoint's ``model.*`` weights: the critic starts from the
    policy's features, the usual PPO-RLHF initialisation when no reward model is at hand.
The head is zero-initialised (V = 0 before the first update): identical on every rank without relying on
a shared RNG, and the first step's advantages are the plain (whitened) returns.

**Placement.** The critic is a second FSDP2 module on the *trainer's* ranks and device mesh (its own
shards, AdamW and gradient clip), not a separate group of Ray actors. On this platform's main target, a
few CPU cores or one GPU per rank, that is both simpler and cheaper: the values for a row are needed by
the policy step on the same rank, so nothing crosses processes (no second rendezvous, no Ray transfers
of [B, T] tensors, no extra placement bundles), and in the sync loop a separate group would only wait
while the policy trains (and vice versa), so a disjoint pool would sit idle half the time. A critic as
large as the policy on many GPUs would want its own group; ``Critic`` is the unit that would move there.

**Alignment.** Position j of the ``[L-1]`` next-token axis (``TrainBatch.loss_mask``) is the state
``x[0..j]`` before token ``x[j+1]`` is sampled; its value is the head's output at hidden position j, the
position whose logits predict ``x[j+1]``.
"""

from __future__ import annotations

import contextlib

import torch

from relayrl.config import CriticConfig
from relayrl.trainer.fsdp import clip_and_step, shard_model
from relayrl.trainer.losses import masked_token_sum, value_loss
from relayrl.trainer.packing import attention_mask_4d, place
from relayrl.types import TrainBatch

_HEAD_NAMES = ("score", "classifier")     # what HF *ForTokenClassification classes call their head


@contextlib.contextmanager
def _quiet_transformers():
    """Silence the load report that lists the (expected) missing head weights."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def value_head(model: torch.nn.Module) -> torch.nn.Linear:
    """The ``Linear(hidden, 1)`` head of a token-classification model."""
    for name in _HEAD_NAMES:
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Linear) and head.out_features == 1:
            return head
    raise ValueError(f"{type(model).__name__} has no 1-output head named one of {_HEAD_NAMES}; the critic needs "
                     "a model family with an AutoModelForTokenClassification class (Llama, Qwen2, Mistral, ...)")


def load_value_model(model_path: str) -> torch.nn.Module:
    """The policy checkpoint as ``AutoModelForTokenClassification(num_labels=1)``, float32, head zeroed."""
    from transformers import AutoModelForTokenClassification

    try:
        with _quiet_transformers():
            model = AutoModelForTokenClassification.from_pretrained(model_path, num_labels=1, dtype=torch.float32)
    except ValueError as exc:
        raise ValueError(f"cannot build a critic from {model_path}: {str(exc).splitlines()[0]}; PPO "
                         "(algorithm.name=gae) needs a model family with a token-classification class") from None
    head = value_head(model)
    with torch.no_grad():
        head.weight.zero_()
        if head.bias is not None:
            head.bias.zero_()
    return model


class Critic:
    """The value model of one trainer rank: FSDP2-sharded on the rank's mesh, trained with clipped value loss.

    Every method that runs the model is a collective (FSDP2 gathers parameters), so all ranks call it
    together, like the policy's.
    """

    def __init__(self, model_path: str, mesh, device: torch.device, dtype: str, cfg: CriticConfig,
                 world_size: int):
        self.cfg, self.device, self.world_size = cfg, device, world_size
        self.model = shard_model(load_value_model(model_path).to(device), mesh, dtype, trainable=True)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def _forward(self, mb: TrainBatch) -> torch.Tensor:
        """V at every next-token position from ``target_start``: [B, L] -> [B, L-1-target_start] float32.

        A packed micro-batch (``batch.MicroBatch.packed``) runs as its one padding-free row with the block
        mask (``packing.py``); V at a scored entry is the head at the entry's position (a value does not
        depend on the next token, so the shared last prompt position gives every completion the same V).
        """
        row = getattr(mb, "packed", None)
        if row is None:
            out = self.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits  # [B, L, 1]
            return out[:, mb.target_start: mb.input_ids.shape[1] - 1, 0].float()
        mask = attention_mask_4d(row, self.model.config._attn_implementation, torch.float32)
        out = self.model(input_ids=row.input_ids, position_ids=row.position_ids, attention_mask=mask).logits
        return place(out[0, row.score_pos, 0].float(), row.gather)                              # [b, T]

    @torch.no_grad()
    def values(self, mb: TrainBatch) -> torch.Tensor:
        """V_old for GAE and the value clip, before any update of this step: [B, T] aligned with loss_mask."""
        return self._forward(mb)

    def train_micro(self, mb: TrainBatch, old_values: torch.Tensor, returns: torch.Tensor,
                    n_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """Backward of this micro-batch's share of the step's token-mean clipped value loss.

        The loss is ``sum_tokens 0.5 max((V - R)^2, (V_clip - R)^2) / n_tokens`` (``losses.value_loss``),
        ``n_tokens`` the step's completion tokens on all ranks; times world_size because FSDP2 averages
        gradients over ranks. Returns token sums: value_loss, value_clip_frac (divide by tokens).
        """
        per_token, stats = value_loss(self._forward(mb), old_values, returns, mb.loss_mask, self.cfg.value_clip)
        total = masked_token_sum(per_token, mb.loss_mask)
        (total * self.world_size / n_tokens).backward()
        return {"value_loss": total.detach(), "value_clip_frac": stats["vf_clip_frac"] * mb.loss_mask.sum()}

    def step(self) -> float:
        """Clip the critic's gradient norm at ``critic.grad_clip`` and step its AdamW; the pre-clip norm."""
        return clip_and_step(self.model, self.optimizer, self.cfg.grad_clip)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full, unsharded CPU state dict with HF names (every rank gets it; collective)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
