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

**Its part of a train step** (``TrainerActor.train_step`` calls ``advantages`` then ``train``)::

    V_old = critic(mb)                                  every micro-batch, before any update
    r_t = R at the last token - kl_coef * KL_t          KL_t = KL_ESTIMATORS[kl_estimator](pi_old, pi_ref)
    A, R_t = GAE(r, V_old; gamma, lam)                  ``advantages.outcome_gae``
    mb.advantages = A whitened with the whole step's mean and std (all ranks)
    for epoch in 1..E:  for micro-batch:  (clipped value loss summed over tokens / step tokens).backward()
                        clip_grad_norm_ ; AdamW step

The critic and the policy share no parameters, so training the critic after the policy's epochs gives the
same numbers as interleaving the two.

**Alignment.** Position j of the ``[L-1]`` next-token axis (``TrainBatch.loss_mask``) is the state
``x[0..j]`` before token ``x[j+1]`` is sampled; its value is the head's output at hidden position j, the
position whose logits predict ``x[j+1]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh

from relayrl.algorithms.advantages import masked_moments, moments_mean_var, outcome_gae, whiten_from_moments
from relayrl.algorithms.losses import KL_ESTIMATORS, masked_token_sum, value_loss
from relayrl.config import AlgorithmConfig, CriticConfig
from relayrl.trainer.attention import packed_spans, use_packed_attention
from relayrl.trainer.fsdp import clip_and_step, shard_model
from relayrl.trainer.hf import full_state_dict
from relayrl.trainer.optim import adamw
from relayrl.trainer.packing import place
from relayrl.trainer.step import AllReduce, TokenSums
from relayrl.types import TrainBatch

_HEAD_NAMES = ("score", "classifier")  # what HF *ForTokenClassification classes call their head


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
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
    raise ValueError(
        f"{type(model).__name__} has no 1-output head named one of {_HEAD_NAMES}; the critic needs "
        "a model family with an AutoModelForTokenClassification class (Llama, Qwen2, Mistral, ...)"
    )


def load_value_model(model_path: str) -> torch.nn.Module:
    """The policy checkpoint as ``AutoModelForTokenClassification(num_labels=1)``, float32, head zeroed."""
    from transformers import AutoModelForTokenClassification

    try:
        with _quiet_transformers():
            model = AutoModelForTokenClassification.from_pretrained(model_path, num_labels=1, dtype=torch.float32)
    except ValueError as exc:
        raise ValueError(
            f"cannot build a critic from {model_path}: {str(exc).splitlines()[0]}; PPO "
            "(algorithm.name=gae) needs a model family with a token-classification class"
        ) from None
    head = value_head(model)
    with torch.no_grad():
        head.weight.zero_()
        if head.bias is not None:
            head.bias.zero_()
    return model


@dataclass
class ValueStats(TokenSums):
    """The critic's stats of one micro-batch (or of the step so far): token sums (``step.TokenSums``)."""

    value_loss: torch.Tensor
    """0.5 max((V - R)^2, (V_clip - R)^2) (``losses.value_loss``)."""
    value_clip_frac: torch.Tensor
    """Share of tokens where the clipped term was the larger."""


@dataclass
class GaeTargets:
    """What ``Critic.advantages`` leaves for ``Critic.train``: per micro-batch V_old and returns [b, T]."""

    values: list[torch.Tensor]
    returns: list[torch.Tensor]
    stats: dict[str, float]
    """Step-wide: explained_variance of V_old (1 - Var(R - V) / Var(R)), value_mean, return_mean, and the
    mean KL of the penalty (``kl``) with a reference model."""


class Critic:
    """The value model of one trainer rank: FSDP2-sharded on the rank's mesh, trained with clipped value loss.

    Every method that runs the model is a collective (FSDP2 gathers parameters), so all ranks call it
    together, like the policy's. ``all_reduce(value, op)`` reduces over the trainer's dp ranks.
    """

    def __init__(
        self,
        model_path: str,
        mesh: DeviceMesh,
        device: torch.device,
        dtype: str,
        cfg: CriticConfig,
        world_size: int,
        algo: AlgorithmConfig,
        all_reduce: AllReduce,
        fused_adamw: bool,
        checkpoint_every: int = 0,
    ):
        self.cfg, self.device, self.world_size = cfg, device, world_size
        self.algo, self.all_reduce = algo, all_reduce
        model = use_packed_attention(load_value_model(model_path).to(device))
        self.model = shard_model(model, mesh, dtype, trainable=True, checkpoint_every=checkpoint_every)
        self.optimizer = adamw(self.model.parameters(), device, fused_adamw, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def _forward(self, mb: TrainBatch) -> torch.Tensor:
        """V at every next-token position from ``target_start``: [B, L] -> [B, L-1-target_start] float32.

        A packed micro-batch (``batch.MicroBatch.packed``) runs as its one padding-free row with the block
        mask (``packing.py``); V at a scored entry is the head at the entry's position (a value does not
        depend on the next token, so the shared last prompt position gives every completion the same V).
        """
        row = getattr(mb, "packed", None)
        if row is None:
            out = self.model(input_ids=mb.input_ids).logits  # [B, L, 1]; right padding: causal is exact
            return out[:, mb.target_start : mb.input_ids.shape[1] - 1, 0].float()
        spans = packed_spans(self.model, row)
        out = self.model(input_ids=row.input_ids, position_ids=row.position_ids, packed_spans=spans).logits
        return place(out[0, row.score_pos, 0].float(), row.gather)  # [b, T]

    @torch.no_grad()
    def values(self, mb: TrainBatch) -> torch.Tensor:
        """V_old for GAE and the value clip, before any update of this step: [B, T] aligned with loss_mask."""
        return self._forward(mb)

    def advantages(
        self,
        micro: Sequence[TrainBatch],
        n_tokens: torch.Tensor,
        old: list[torch.Tensor] | None = None,
        ref: list[torch.Tensor] | None = None,
    ) -> GaeTargets:
        """PPO: V_old, token rewards with the KL penalty, GAE, and advantages whitened with the whole step's
        mean/std (all ranks), written to each ``mb.advantages`` [b, T].

        ``old``, ``ref``: pi_old's and pi_ref's logprobs per micro-batch, given with a reference model; the
        penalty is ``kl_coef * KL_ESTIMATORS[kl_estimator](pi_old, pi_ref)``.
        """
        values, returns, advantages = [], [], []
        kl_sum = torch.zeros((), device=self.device)
        for i, mb in enumerate(micro):
            v, penalty = self.values(mb), None
            if ref is not None:
                assert old is not None, "the KL penalty needs pi_old's logprobs (old) with pi_ref's (ref)"
                kl = KL_ESTIMATORS[self.algo.kl_estimator](old[i], ref[i])
                penalty, kl_sum = self.algo.kl_coef * kl, kl_sum + masked_token_sum(kl, mb.loss_mask)
            assert mb.rewards is not None  # build_train_batch keeps every sequence's reward
            adv, ret = outcome_gae(mb.rewards, v, mb.loss_mask, self.algo.gamma, self.algo.lam, penalty)
            values.append(v)
            returns.append(ret)
            advantages.append(adv)
        adv_moments = self._step_moments(advantages, micro)
        for mb, adv in zip(micro, advantages):
            mb.advantages = whiten_from_moments(adv, mb.loss_mask, adv_moments)
        (v_mean, _), (r_mean, r_var), (_, err_var) = (
            moments_mean_var(self._step_moments(xs, micro))
            for xs in (values, returns, [r - v for v, r in zip(values, returns)])
        )
        stats = {
            "explained_variance": float(1.0 - err_var / r_var.clamp(min=1e-8)),
            "value_mean": float(v_mean),
            "return_mean": float(r_mean),
        }
        if ref is not None:
            stats["kl"] = float(self.all_reduce(kl_sum) / n_tokens)
        return GaeTargets(values, returns, stats)

    def _step_moments(self, xs: list[torch.Tensor], micro: Sequence[TrainBatch]) -> torch.Tensor:
        """``masked_moments`` [n, sum, sum of squares] of [b, T] tensors over the whole step (all ranks)."""
        local = torch.stack([masked_moments(x, mb.loss_mask) for x, mb in zip(xs, micro)]).sum(0)
        return self.all_reduce(local, dtype=torch.float64)

    def train(
        self, micro: Sequence[TrainBatch], targets: GaeTargets, n_tokens: torch.Tensor, epochs: int
    ) -> dict[str, float]:
        """``epochs`` passes of the value loss over the step's micro-batches, one AdamW step each; returns
        value_loss, value_clip_frac (token means over ranks and epochs) and critic_grad_norm (epoch mean)."""
        sums, norms = ValueStats.zeros(self.device), []
        for _ in range(epochs):
            for mb, v, r in zip(micro, targets.values, targets.returns):
                sums.add_(self.train_micro(mb, v, r, n_tokens))
            norms.append(self.step())
        return sums.reduce(self.all_reduce, epochs, n_tokens) | {"critic_grad_norm": sum(norms) / len(norms)}

    def train_micro(
        self, mb: TrainBatch, old_values: torch.Tensor, returns: torch.Tensor, n_tokens: torch.Tensor
    ) -> ValueStats:
        """Backward of this micro-batch's share of the step's token-mean clipped value loss.

        The loss is ``sum_tokens 0.5 max((V - R)^2, (V_clip - R)^2) / n_tokens`` (``losses.value_loss``),
        ``n_tokens`` the step's completion tokens on all ranks; times world_size because FSDP2 averages
        gradients over ranks. Returns its token sums.
        """
        per_token, stats = value_loss(self._forward(mb), old_values, returns, mb.loss_mask, self.cfg.value_clip)
        total = masked_token_sum(per_token, mb.loss_mask)
        (total * self.world_size / n_tokens).backward()
        return ValueStats(value_loss=total.detach(), value_clip_frac=stats["vf_clip_frac"] * mb.loss_mask.sum())

    def step(self) -> float:
        """Clip the critic's gradient norm at ``critic.grad_clip`` and step its AdamW; the pre-clip norm."""
        return clip_and_step(self.model, self.optimizer, self.cfg.grad_clip)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full, unsharded CPU state dict with HF names (every rank gets it; collective)."""
        return full_state_dict(self.model)
