"""The policy's micro-batch step and the stats it reports.

``PolicyStep.train_micro`` runs one micro-batch: forward (padded or packed rows, ``trainer.dtype``), the
per-token loss the ``Objective`` (``objective.py``) defines, backward of the micro-batch's share of the
step's loss, and the token sums of its stats as a ``StepStats``. Every ``LOSS_AGG`` mode is a ratio of sums
(tokens, or sequences, or sequences x L), so with the denominator summed over the whole step on all ranks
the gradient is that of the step's loss however the step is split into ranks and micro-batches (a
sequence is never split, so per-sequence means stay local).

``TokenSums`` records (``StepStats`` here, the critic's ``ValueStats``) are the stats themselves: each field
is a 0-dim tensor summed over one rank's tokens, its metadata says how the step's value is made from it,
so the keys ``train_step`` reports and the order they are reduced in are the fields and cannot drift apart:

    sum over micro-batches and epochs, all-reduce (sum) over the dp ranks, / epochs, then
        / the step's completion tokens        (default: token-weighted means)
        / the step's LOSS_AGG denominator     (``PER_DENOMINATOR``: ``loss``)
    or the max over all of them               (``MAX``: ``ratio_max``)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

import torch
import torch.distributed as dist

from relayrl.algorithms.losses import entropy_bonus, kl_k3, kl_loss, masked_token_sum
from relayrl.algorithms.objective import Objective
from relayrl.trainer import context, head
from relayrl.trainer.attention import packed_spans
from relayrl.trainer.batch import MicroBatch
from relayrl.trainer.fsdp import clip_and_step
from relayrl.trainer.packing import PackedRow, place
from relayrl.trainer.precision import autocast

PER_TOKEN, PER_DENOMINATOR, MAX = "tokens", "denominator", "max"  # how a ``TokenSums`` field is reduced
AllReduce = Callable[..., torch.Tensor]  # (value, op) -> value reduced over the dp ranks
Forward = tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]  # logprobs, entropy, to_batch


@dataclass
class TokenSums:
    """Base of the step's stat records: 0-dim tensor fields, reduced as their metadata says (module doc)."""

    @classmethod
    def zeros(cls, device: torch.device) -> Self:
        """The accumulator a step starts from (0 is also the floor of ``MAX`` fields)."""
        return cls(**{f.name: torch.zeros((), device=device) for f in dataclasses.fields(cls)})

    def add_(self, other: Self) -> Self:
        """Accumulate ``other`` in place: sums add, ``MAX`` fields keep the larger."""
        for f in dataclasses.fields(self):
            if _reduction(f) == MAX:
                setattr(self, f.name, torch.maximum(getattr(self, f.name), getattr(other, f.name)))
            else:
                getattr(self, f.name).add_(getattr(other, f.name))
        return self

    def reduce(
        self, all_reduce: AllReduce, epochs: int, tokens: torch.Tensor, denominator: torch.Tensor | None = None
    ) -> dict[str, float]:
        """The step's values on every rank: sums over dp ranks / epochs / tokens (or the denominator);
        ``MAX`` fields the max over ranks. One all-reduce for all sums."""
        fields = dataclasses.fields(self)
        sums = [f for f in fields if _reduction(f) != MAX]
        total = all_reduce(torch.stack([getattr(self, f.name) for f in sums]), dist.ReduceOp.SUM) / epochs
        out = {
            f.name: float(v / (denominator if _reduction(f) == PER_DENOMINATOR else tokens))
            for f, v in zip(sums, total)
        }
        return out | {
            f.name: float(all_reduce(getattr(self, f.name), dist.ReduceOp.MAX)) for f in fields if _reduction(f) == MAX
        }


def reduced(how: str) -> dict[str, Any]:
    """The metadata of a ``TokenSums`` field reduced ``how`` (``PER_DENOMINATOR`` or ``MAX``; plain fields are
    ``PER_TOKEN``): ``dataclasses.field(metadata=reduced(MAX))``, a field call that type checkers read."""
    return {"reduce": how}


def _reduction(f: dataclasses.Field) -> str:
    return f.metadata.get("reduce", PER_TOKEN)


@dataclass
class StepStats(TokenSums):
    """The policy's stats of one micro-batch (or of the step so far), as ``train_step`` reports them."""

    loss: torch.Tensor = dataclasses.field(metadata=reduced(PER_DENOMINATOR))
    """LOSS_AGG numerator: the step's loss once divided by the step's denominator."""
    clip_frac: torch.Tensor
    """Share of tokens whose ratio the clip held."""
    approx_kl: torch.Tensor
    """k3 estimate of KL(pi_old || pi)."""
    ratio_mean: torch.Tensor
    """Mean of the ratio pi / pi_old."""
    kl: torch.Tensor
    """KL to the reference in the loss (0 without one; PPO reports the reward's KL instead)."""
    entropy: torch.Tensor
    """Entropy of the policy at the sampling temperature."""
    behaviour_kl: torch.Tensor
    """k3 KL(engine || trainer) before the update: ~0 on-policy; large if weight sync or sampling differ."""
    is_weight: torch.Tensor
    """Mean importance weight pi_old / mu after truncation (1 with off_policy none)."""
    is_trunc_frac: torch.Tensor
    """Share of tokens whose importance weight was truncated."""
    ratio_max: torch.Tensor = dataclasses.field(metadata=reduced(MAX))
    """Largest ratio pi / pi_old."""


@dataclass(frozen=True)
class PolicyStep:
    """How the policy is scored and trained on one micro-batch: the objective, the sampling temperature
    (logprobs and entropy are those of the distribution the engines sampled from), ``trainer.dtype`` and
    ``trainer.logits_chunk`` (positions per LM-head chunk, ``head.py``)."""

    objective: Objective
    temperature: float
    dtype: str
    logits_chunk: int = 1024
    context: context.Group | None = None
    """``trainer.cp_size > 1``: this rank's cp group; each packed row runs split over it (``context.py``)."""

    def forward(self, model: torch.nn.Module, mb: MicroBatch, entropy_grad: bool = False) -> Forward:
        """What the loss needs from the model: (logprobs [R, K], entropies [R, K], ``to_batch`` laying per-entry
        values [R, K, ...] out like ``mb.loss_mask`` [b, T, ...]).

        The head scores only the positions the loss reads, ``logits_chunk`` at a time, and never holds
        [R, K, V] logits (``head.py``; the entropy has a gradient only with ``entropy_grad``). Padded rows:
        R = b, K = T, positions from ``target_start``. Packed: one row with position ids per sequence,
        attention per span (``attention.py``), K scored entries (``packing.py``).
        ``trainer.dtype=bf16`` runs the model under autocast with the LM head in float32.
        """
        device = mb.input_ids.device
        with autocast(device.type, self.dtype):
            if mb.packed is None:
                keep = torch.arange(mb.target_start, mb.input_ids.shape[1] - 1, device=device)
                targets = mb.input_ids[:, mb.target_start + 1 :]
                with head.scoring(model, self._request(targets, entropy_grad)):
                    out = model(input_ids=mb.input_ids, use_cache=False, logits_to_keep=keep).logits
                return out[..., 0], out[..., 1], lambda v: v
            row = mb.packed
            if self.context is not None:
                return self._forward_shard(model, row, entropy_grad)
            with head.scoring(model, self._request(row.score_target[None], entropy_grad)):
                out = model(
                    input_ids=row.input_ids,
                    position_ids=row.position_ids,
                    use_cache=False,
                    logits_to_keep=row.score_pos,
                    packed_spans=packed_spans(model, row),
                ).logits
            return out[..., 0], out[..., 1], lambda v: place(v[0], row.gather)

    def _forward_shard(self, model: torch.nn.Module, row: PackedRow, entropy_grad: bool) -> Forward:
        """``forward`` of a packed row under context parallelism: this rank's slice of the row, the row's
        entries gathered from every rank of the cp group (``context.py``)."""
        assert self.context is not None
        shard = context.shard_row(row, self.context)
        with head.scoring(model, self._request(shard.score_target[None], entropy_grad)):
            out = model(
                input_ids=shard.input_ids,
                position_ids=shard.position_ids,
                use_cache=False,
                logits_to_keep=shard.score_pos,
                packed_spans=packed_spans(model, shard.row),
                context_shard=shard.attn,
            ).logits
        out = context.gather_entries(out, shard, self.context)
        return out[..., 0], out[..., 1], lambda v: place(v[0], row.gather)

    def _request(self, targets: torch.Tensor, entropy_grad: bool) -> head.Request:
        return head.Request(targets, self.temperature, self.logits_chunk, entropy_grad)

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        """Per-token logprobs [b, T] aligned with ``mb.loss_mask`` (no graph)."""
        logprobs, _, to_batch = self.forward(model, mb)
        return to_batch(logprobs)

    def reference_logprobs(
        self, model: torch.nn.Module, ref_model: torch.nn.Module | None, micro: list[MicroBatch]
    ) -> list[torch.Tensor]:
        """Reference logprobs: the frozen copy's (``ref_model``), or with LoRA (no copy) the policy's own with
        its adapters bypassed: the base model, which is the reference, as the adapters are all that trains."""
        from relayrl.trainer import lora

        if ref_model is not None:
            return [self.logprobs(ref_model, mb) for mb in micro]
        with lora.adapters_off(model):
            return [self.logprobs(model, mb) for mb in micro]

    def train_micro(
        self,
        model: torch.nn.Module,
        mb: MicroBatch,
        old: torch.Tensor | None,
        ref: torch.Tensor | None,
        denom: torch.Tensor,
        dp_size: int,
    ) -> tuple[StepStats, torch.Tensor]:
        """Forward/backward one micro-batch; returns its stat sums and the old logprobs (``old`` if given,
        else this forward's detached logprobs: valid before any update).

        per_token = policy loss [+ kl_coef * KL to ``ref``] [- entropy_coef * H]; the backward is of
        ``LOSS_AGG numerator * dp_size / denom``: FSDP2 averages gradients over the dp ranks, the factor turns
        that back into a sum, so the gradient is d(sum of all dp ranks' numerators / D_step). TP ranks share
        rows and compute one loss.
        """
        entropy_grad = self.objective.entropy_coef > 0
        logprobs, entropy, to_batch = self.forward(model, mb, entropy_grad)
        logprobs = to_batch(logprobs)
        old = logprobs.detach() if old is None else old
        per_token, stats = self.objective.policy(logprobs, old, mb)
        kl_sum = mb.loss_mask.new_zeros(())
        if ref is not None:
            kl_term, kl_stats = kl_loss(
                logprobs, ref, mb.loss_mask, self.objective.kl_coef, self.objective.kl_estimator
            )
            per_token, kl_sum = per_token + kl_term, kl_stats["kl"] * mb.loss_mask.sum()
        entropy_term, entropy_sum = self._entropy(to_batch(entropy), mb)
        if entropy_term is not None:
            per_token = per_token + entropy_term
        numerator, _ = self.objective.aggregate(per_token, mb.loss_mask)
        (numerator * dp_size / denom).backward()
        return self._stats(stats, numerator, kl_sum, entropy_sum, old, mb), old

    def epochs(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        micro: list[MicroBatch],
        old: list[torch.Tensor | None],
        ref: list[torch.Tensor] | None,
        denom: torch.Tensor,
        dp_size: int,
        epochs: int,
        grad_clip: float,
        live: list[bool],
    ) -> tuple[StepStats, list[float]]:
        """``epochs`` passes over the micro-batches, each ending in a clipped AdamW step; returns the summed
        stats and each epoch's pre-clip gradient norm. Fills ``old`` in the first epoch.

        Micro-batch i runs only where ``live[i]`` (``learnable``: the same list on every dp rank, so FSDP's
        collectives still pair up). The caller makes no call with none live: AdamW would still move the
        weights by its momentum and weight decay."""
        sums, grad_norms = StepStats.zeros(denom.device), []
        for _ in range(epochs):
            for i, mb in enumerate(micro):
                if live[i]:
                    stats, old[i] = self.train_micro(model, mb, old[i], ref[i] if ref else None, denom, dp_size)
                    sums.add_(stats)
            grad_norms.append(clip_and_step(model, optimizer, grad_clip))
        return sums, grad_norms

    @staticmethod
    @torch.no_grad()
    def _stats(
        stats: dict[str, torch.Tensor],
        numerator: torch.Tensor,
        kl_sum: torch.Tensor,
        entropy_sum: torch.Tensor,
        old: torch.Tensor,
        mb: MicroBatch,
    ) -> StepStats:
        """The policy loss's means (``stats``) weighted back into token sums, with the step's other terms."""
        ntok = mb.loss_mask.sum()
        return StepStats(
            loss=numerator.detach(),
            clip_frac=stats["clip_frac"] * ntok,
            approx_kl=stats["approx_kl"] * ntok,
            ratio_mean=stats["ratio_mean"] * ntok,
            kl=kl_sum.detach(),
            entropy=entropy_sum,
            behaviour_kl=masked_token_sum(kl_k3(mb.behaviour_logprobs, old), mb.loss_mask),
            is_weight=stats.get("is_weight_mean", ntok.new_ones((), dtype=torch.float32)) * ntok,
            is_trunc_frac=stats.get("is_trunc_frac", ntok.new_zeros((), dtype=torch.float32)) * ntok,
            ratio_max=stats["ratio_max"],
        )

    def _entropy(self, entropy: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(entropy-bonus loss term [b, T] or None when entropy_coef is 0, token-summed entropy for stats);
        ``entropy`` [b, T] aligned with ``mb.loss_mask``."""
        if self.objective.entropy_coef <= 0:
            return None, masked_token_sum(entropy.detach(), mb.loss_mask)
        term, stats = entropy_bonus(entropy, mb.loss_mask, self.objective.entropy_coef)
        return term, stats["entropy"] * mb.loss_mask.sum()


def learnable(micro: list[MicroBatch], objective: Objective, all_reduce: AllReduce) -> list[bool]:
    """Per micro-batch: whether it has anything to learn on some dp rank, the same list on every rank.

    A micro-batch whose trained tokens all have advantage 0 adds exactly 0 to the loss and its gradient when
    the advantage is the loss's only weight (``Objective.only_advantages``), so its forward and backward are
    skipped: the step's gradient is unchanged, its time is not spent (a group whose rewards don't vary, the
    filler rows that even out the ranks' shares). One all-reduce (max) over the dp ranks.
    """
    if not micro or not objective.only_advantages:
        return [True] * len(micro)
    local = torch.stack([_has_signal(mb) for mb in micro]).float()
    return [bool(v) for v in all_reduce(local, dist.ReduceOp.MAX)]


def _has_signal(mb: MicroBatch) -> torch.Tensor:
    """True where a trained token of ``mb`` has a non-zero advantage ([b] per sequence or [b, T] per token)."""
    trained = mb.loss_mask > 0
    nonzero = mb.advantages != 0
    if mb.advantages.dim() == 1:
        return (nonzero & trained.any(dim=1)).any()
    return (nonzero & trained).any()


def step_totals(
    micro: list[MicroBatch], objective: Objective, all_reduce: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(completion tokens, ``LOSS_AGG`` denominator) of the whole step on all ranks, each >= 1.

    Denominators depend only on the masks, so they are known before any forward pass; one all-reduce
    gives every rank the global value to divide its numerators by.
    """
    dens = [objective.aggregate(torch.zeros_like(mb.loss_mask), mb.loss_mask)[1] for mb in micro]
    local = torch.stack([torch.stack([mb.loss_mask.sum() for mb in micro]).sum(), torch.stack(dens).sum()])
    n_tokens, denom = all_reduce(local).clamp(min=1)
    return n_tokens, denom
