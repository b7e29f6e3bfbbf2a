"""Pipeline stages of an HF decoder on ``torch.distributed.pipelining``, and the RL loss on the last stage.

An HF causal LM of L layers (``model.model.embed_tokens``, ``.layers``, ``.norm``, ``.rotary_emb`` and
``model.lm_head``: Llama, Qwen2, SmolLM2) is cut into S = pp · v stages of L / S consecutive layers
(``stage_layers``). Pipeline rank r holds stages r, r + pp, ..., r + (v − 1) pp (``stage_ids``): one stage
under GPipe and 1F1B, v "virtual" stages under interleaved 1F1B and zero bubble, the looped order torch's
``ScheduleInterleaved1F1B`` and ``ScheduleInterleavedZeroBubble`` and Megatron-LM's interleaving use. Zero bubble
(ZB-H1, Qi et al. 2024) splits each backward into its input half, which the previous stage waits for, and its
weight half, which the schedule defers into what would be the bubble. The first stage also holds the embedding,
the last the final norm and the LM head; every stage holds the rotary embedding (no parameters).

Rows are padded: causal attention with right padding needs no mask (a pad only follows the tokens it could
disturb), positions are 0..T−1, and activations crossing a stage boundary are hidden states [b, T, H].

The loss (``rl_loss``) runs on the last stage for each micro-batch. Its target is one float tensor
[b, T, 6], chunked along the batch like the input: the token each position predicts, the advantage, the old
logprob (NaN: this forward's own, detached, as the first epoch's is), the loss mask, the engine's logprob (for
an off-policy weight and ``behaviour_kl``) and the reference's (GRPO's KL term; token ids below 2^24 are exact
in float32). The logprobs come from the final hidden states through the chunked head (``head.head_scores``: [N, V]
logits never exist), the per-token loss from the objective's policy loss (plus GRPO's KL term, and an entropy
bonus with the entropy's gradient when ``algorithm.entropy_coef`` > 0), and the micro-batch's loss is its
``LOSS_AGG`` numerator over the step's global denominator, so that the schedule's sum over micro-batches is the
step's loss however it is split (``scale_grads=False``: the schedule must not divide by the micro-batch count).

A tied embedding (the LM head is the embedding matrix) lives on the first and the last stage; after the
backward, ``sync_tied_grads`` sums its gradient over the two, as Megatron-LM does, so both copies take the
same update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, cast

import torch
import torch.distributed as dist
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)
from torch.distributed.pipelining.stage import _PipelineStageBase
from torch.distributed.tensor import DTensor

from relayrl.algorithms.kl import kl_loss
from relayrl.algorithms.losses import entropy_bonus, masked_token_sum
from relayrl.algorithms.objective import Objective
from relayrl.config.base import choices_of
from relayrl.config.trainer import LOOPED, PipelineSchedule
from relayrl.trainer import attention, head
from relayrl.trainer.fsdp import squared_norm
from relayrl.trainer.optim import adamw_step, local_tensor
from relayrl.trainer.step import PolicyStep, StepStats

SCHEDULES = choices_of(PipelineSchedule)
TARGET_COLUMNS = 6  # next token, advantage, old, mask, behaviour, reference (``targets``)
CAUSAL_WITHOUT_MASK = ("sdpa", attention.NAME)
"""Attention kernels that attend causally when given no mask (the stages pass none)."""
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def stage_layers(num_layers: int, stages: int) -> list[range]:
    """The layers of each of ``stages`` stages: equal runs of consecutive layers."""
    if stages < 1 or num_layers % stages:
        raise ValueError(
            f"the model's {num_layers} layers do not split into {stages} pipeline stages "
            "(trainer.pp_size x trainer.pp_virtual_stages); choose sizes whose product divides the layers"
        )
    per = num_layers // stages
    return [range(k * per, (k + 1) * per) for k in range(stages)]


def stage_ids(pp_rank: int, pp_size: int, virtual: int = 1) -> list[int]:
    """The stages pipeline rank ``pp_rank`` holds: pp_rank, pp_rank + pp, ... (looped)."""
    return [pp_rank + i * pp_size for i in range(virtual)]


class Stage(torch.nn.Module):
    """Layers ``layers`` of ``model`` (and the embedding if ``first``, the norm and LM head if ``last``). Its
    parameters are the model's own tensors: ``global_name`` maps a stage name back to the model's."""

    def __init__(self, model: torch.nn.Module, layers: range, first: bool, last: bool):
        super().__init__()
        if attention.attn_implementation(model) not in CAUSAL_WITHOUT_MASK:
            raise ValueError(
                f"pipeline stages need causal attention without a mask ({' or '.join(CAUSAL_WITHOUT_MASK)}), "
                f"the model runs {attention.attn_implementation(model)!r}; load it with attn_implementation='sdpa'"
            )
        inner = cast(Any, model).model
        self.layer_ids = list(layers)
        self.embed_tokens = inner.embed_tokens if first else None
        self.layers = torch.nn.ModuleList(inner.layers[i] for i in layers)
        self.rotary_emb = inner.rotary_emb
        self.norm = inner.norm if last else None
        self.lm_head = head.lm_head(model) if last else None
        self.tied = _tied(model)
        self.packed: list[Any] = []  # packed rows: each micro-batch's ``pp_packed.PackedInput``, by index

    def forward(self, x: torch.Tensor, mb: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids [b, T] (first stage) or hidden states [b, T, H] -> hidden states (the last: normed). Padded
        rows attend causally from position 0; packed micro-batch ``mb`` (its index, [1]) by its row's spans."""
        hidden = self.embed_tokens(x) if self.embed_tokens is not None else x
        extra: dict[str, Any] = {}
        if mb is None:
            positions = torch.arange(hidden.shape[1], device=hidden.device)[None]
        else:
            positions, spans = self.packed[int(mb.reshape(-1)[0])]
            extra["packed_spans"] = spans
        rotary = self.rotary_emb(hidden, positions)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=rotary, **extra)
        return self.norm(hidden) if self.norm is not None else hidden

    def global_name(self, name: str) -> str:
        """``layers.0.mlp...`` -> ``model.layers.<its layer>.mlp...``; ``lm_head.weight`` stays, or when tied is
        the embedding's (the model names a tied matrix once, as the embedding)."""
        top, _, rest = name.partition(".")
        if top == "layers":
            local, _, rest = rest.partition(".")
            return f"model.layers.{self.layer_ids[int(local)]}.{rest}"
        if top == "lm_head":
            return "model.embed_tokens.weight" if self.tied and rest == "weight" else name
        return f"model.{name}"


def device_of(model: torch.nn.Module) -> torch.device:
    """The device of the weights this rank holds (``pp_weights.load_stages`` leaves the others on meta)."""
    return next(p.device for p in model.parameters() if not p.is_meta)


def build_stages(model: torch.nn.Module, pp_rank: int, pp_size: int, virtual: int = 1) -> list[Stage]:
    """This pipeline rank's stages of ``model`` (module docstring)."""
    num_layers = len(cast(Any, model).model.layers)
    runs = stage_layers(num_layers, pp_size * virtual)
    last = len(runs) - 1
    return [Stage(model, runs[k], k == 0, k == last) for k in stage_ids(pp_rank, pp_size, virtual)]


class _Rows(NamedTuple):
    """What ``Objective.policy`` and ``PolicyStep._stats`` read of a micro-batch, from a target's columns."""

    advantages: torch.Tensor
    loss_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor


def rl_loss(
    objective: Objective,
    temperature: float,
    chunk: int,
    denominator: torch.Tensor,
    record: Callable[[StepStats], None] | None = None,
) -> Callable:
    """The last stage's loss of one micro-batch, given its LM head (module docstring); ``record`` receives
    each micro-batch's ``StepStats`` (token sums, as ``PolicyStep.train_micro`` reports them)."""

    def make(lm_head: Any) -> LossFn:
        def loss_fn(hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            ids, advantages, old, mask, behaviour, ref = target.unbind(-1)
            request = head.Request(ids.long(), temperature, chunk, objective.entropy_coef > 0)
            logprobs, entropy = head.head_scores(lm_head, hidden, request)
            old = torch.where(old.isnan(), logprobs.detach(), old)  # NaN: pi_old is this very forward (epoch 1)
            rows = _Rows(advantages, mask, behaviour)
            return token_loss(objective, logprobs, entropy, old, ref, cast(Any, rows), denominator, record)

        return loss_fn

    return make


def token_loss(
    objective: Objective,
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    old: torch.Tensor,
    ref: torch.Tensor | None,
    rows: Any,
    denominator: torch.Tensor,
    record: Callable[[StepStats], None] | None,
) -> torch.Tensor:
    """One micro-batch's loss over the step's denominator from its [b, T] logprobs and entropies (``rows``: its
    advantages, loss mask and engine logprobs): the policy loss, GRPO's KL to ``ref`` and the entropy bonus, as
    ``PolicyStep.train_micro`` adds them; ``record`` gets its ``StepStats``."""
    mask = rows.loss_mask
    per_token, stats = objective.policy(logprobs, old, rows)
    kl_sum = mask.new_zeros((), dtype=torch.float32)
    if objective.kl_coef > 0:  # GRPO's KL to the reference in the loss (PPO puts it in the reward)
        assert ref is not None, "GRPO's KL term needs the reference's logprobs"
        kl_term, kl_stats = kl_loss(logprobs, ref, mask, objective.kl_coef, objective.kl_estimator)
        per_token, kl_sum = per_token + kl_term, kl_stats["kl"] * mask.sum()
    if objective.entropy_coef > 0:  # the bonus -entropy_coef * H, as ``PolicyStep._entropy`` adds it
        per_token = per_token + entropy_bonus(entropy, mask, objective.entropy_coef)[0]
    numerator, _ = objective.aggregate(per_token, mask)
    if record is not None:
        entropy_sum = masked_token_sum(entropy.detach(), mask)
        record(PolicyStep._stats(stats, numerator, kl_sum, entropy_sum, old, rows))
    return numerator / denominator


def targets(
    input_ids: torch.Tensor,
    advantages: torch.Tensor,
    old: torch.Tensor,
    mask: torch.Tensor,
    behaviour: torch.Tensor | None = None,
    ref: torch.Tensor | None = None,
) -> torch.Tensor:
    """The [b, T, 6] target of padded rows ``input_ids`` [b, T]: the next token, then ``advantages``, ``old``,
    ``mask``, ``behaviour`` (the engine's logprobs; default ``old``) and ``ref`` (the reference's, for a KL term;
    default ``old``), each [b, T − 1] and aligned with the token each position predicts (the last position
    predicts nothing: all zero)."""
    pad = input_ids.new_zeros(input_ids.shape[0], 1)
    nxt = torch.cat([input_ids[:, 1:], pad], dim=1).float()
    zero = mask.new_zeros(mask.shape[0], 1)
    behaviour, ref = (old if x is None else x for x in (behaviour, ref))
    cols = [torch.cat([v, zero], dim=1) for v in (advantages, old, mask, behaviour, ref)]
    return torch.stack([nxt, *cols], dim=-1)


class Pipeline:
    """This rank's stages and a schedule over them; ``step`` runs one forward and backward of a batch in
    ``micro_batches`` micro-batches (gradients accumulate in the stages' parameters)."""

    def __init__(
        self,
        model: torch.nn.Module,
        group: dist.ProcessGroup,
        loss: Callable,
        micro_batches: int,
        schedule: str = "1f1b",
        virtual: int = 1,
    ):
        if schedule not in SCHEDULES:
            raise ValueError(f"trainer.pp_schedule={schedule!r}: {' | '.join(SCHEDULES)}")
        if virtual > 1 and schedule not in LOOPED:
            raise ValueError(f"trainer.pp_virtual_stages={virtual} needs trainer.pp_schedule=interleaved|zero_bubble")
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        if schedule != "gpipe" and micro_batches < self.size:
            raise ValueError(
                f"{micro_batches} micro-batches for {self.size} pipeline stages: 1F1B needs at least one a stage; "
                "raise the step's rows or lower trainer.max_tokens_per_micro_batch"
            )
        self.group, self.model, self.micro_batches = group, model, micro_batches
        self.stages = build_stages(model, self.rank, self.size, virtual)
        total, device = self.size * virtual, device_of(model)
        ids = stage_ids(self.rank, self.size, virtual)
        self.pipe_stages: list[_PipelineStageBase] = [
            PipelineStage(s, i, total, device, group=group) for s, i in zip(self.stages, ids)
        ]
        self.first, self.last = 0 in ids, total - 1 in ids
        lm = head.lm_head(model)
        loss_fn = loss(lm)
        if schedule in LOOPED:
            looped = ScheduleInterleaved1F1B if schedule == "interleaved" else ScheduleInterleavedZeroBubble
            self.schedule: Any = looped(self.pipe_stages, micro_batches, loss_fn=loss_fn, scale_grads=False)
        else:
            cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
            self.schedule = cls(self.pipe_stages[0], micro_batches, loss_fn=loss_fn, scale_grads=False)
        self.tied = _tied(model)

    def step(
        self, input_ids: torch.Tensor, target: torch.Tensor | None, packed: list[Any] | None = None
    ) -> torch.Tensor | None:
        """Forward and backward of one batch; returns the summed loss on the rank holding the last stage.
        ``packed``: the micro-batches are packed rows, ``pp_packed.PackedInput`` each (``target``: the indexes)."""
        losses: list[torch.Tensor] = []
        args = (input_ids,) if self.first else ()
        kw = {"target": target, "losses": losses} if self.last else {}  # the last stage's target
        self.schedule.step(*args, **kw, **self._packed(packed, input_ids.device))
        self.sync_tied_grads()
        return torch.stack(losses).sum().detach() if self.last else None

    def _packed(self, packed: list[Any] | None, device: torch.device) -> dict[str, torch.Tensor]:
        """Every stage's packed rows, and the micro-batch index each stage's forward is handed (``mb``)."""
        if packed is None:
            return {}
        for stage in self.stages:
            stage.packed = packed
        return {"mb": torch.arange(len(packed), device=device)}

    @torch.no_grad()
    def forward_only(self, input_ids: torch.Tensor, packed: list[Any]) -> torch.Tensor | None:
        """The last stage's final hidden states [m, n, H] of packed rows (None on other ranks); the loss is
        skipped (a target index of -1, ``pp_packed.packed_loss``)."""
        args = (input_ids,) if self.first else ()
        skip = {"target": torch.full((len(packed), 1), -1.0, device=input_ids.device)} if self.last else {}
        out = self.schedule.eval(*args, **skip, **self._packed(packed, input_ids.device))
        return out if self.last else None

    def sync_tied_grads(self) -> None:
        """A tied embedding's gradient, summed over the first and the last stage's copies (module doc). The two
        ends are on different ranks whenever pp > 1 (the last stage, pp·v − 1, is on rank pp − 1); the other
        ranks join the all-reduce with zeros, so no subgroup is needed."""
        if not self.tied or self.size == 1:
            return
        weight = cast(Any, self.model).model.embed_tokens.weight
        holds = self.first or self.last
        if holds and weight.grad is None:  # no gradient reached this end: it still takes the other's
            weight.grad = torch.zeros_like(weight)
        # FSDP2 stages (pp_weights.shard_stages): the ends' shards pair up, each dp replica's with its own
        grad = local_tensor(weight.grad) if holds else _tied_zeros(self.model, weight)
        dist.all_reduce(grad, group=self.group)

    @torch.no_grad()
    def logprobs(self, input_ids: torch.Tensor, temperature: float, chunk: int) -> torch.Tensor | None:
        """Forward only: per-position logprobs [b, T − 1] of each next token (the old or a reference policy's),
        on the rank holding the last stage (None elsewhere), through the chunked head."""
        args = (input_ids,) if self.first else ()
        # the schedule's loss runs on the last stage in eval too: an all-masked target makes it 0
        dummy = (
            {"target": input_ids.new_zeros(*input_ids.shape, TARGET_COLUMNS, dtype=torch.float32)} if self.last else {}
        )
        out = self.schedule.eval(*args, **dummy)
        if not self.last:
            return None
        lm: Any = head.lm_head(self.model)
        request = head.Request(input_ids[:, 1:], temperature, chunk)
        logprobs, _ = head.head_scores(lm, out[:, :-1], request)
        return logprobs

    def grad_norm(self) -> torch.Tensor:
        """The whole model's gradient L2 norm, the same on every pipeline rank: each rank's squared norm of
        its stages' gradients, summed over the ranks (a tied embedding counted once, on the first stage). With
        tensor parallelism the split linears' squares are summed over their tp ranks (``fsdp.squared_norm``)
        and the replicated rest counted once."""
        grads = [p.grad for name, p in self._owned() if p.grad is not None]
        by_mesh: dict[Any, list[torch.Tensor]] = {}  # DTensor ops refuse to mix meshes: (dp, tp), dp, none
        for g in grads:
            by_mesh.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
        local = torch.zeros((), dtype=torch.float32)
        for part in by_mesh.values():
            local = local + squared_norm(part)
        local = local.to(grads[0].device if grads else "cpu")
        dist.all_reduce(local, group=self.group)
        return local.sqrt()

    def clip_and_step(self, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
        """Clip to ``grad_clip`` by the global norm (<= 0: no clip), step, zero the grads; returns the norm. A
        NaN/inf norm skips the step on every rank alike (the norm is the same on all)."""
        norm = self.grad_norm()
        if torch.isfinite(norm):
            if grad_clip > 0:
                coef = (grad_clip / (norm + 1e-6)).clamp(max=1.0)
                grads = [local_tensor(p.grad) for _, p in self.named_parameters() if p.grad is not None]
                torch._foreach_mul_(grads, coef.to(grads[0].device))
            adamw_step(optimizer)  # tp-split weights: each rank's shard updated on its local tensors
        optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _owned(self) -> list[tuple[str, torch.nn.Parameter]]:
        """``named_parameters`` less the last stage's copy of a tied embedding (the first stage counts it)."""
        if not self.tied or self.first:
            return self.named_parameters()
        tied = cast(Any, self.model).model.embed_tokens.weight
        return [(n, p) for n, p in self.named_parameters() if p is not tied]

    def named_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """This rank's parameters under the model's own names (each once)."""
        seen: dict[int, tuple[str, torch.nn.Parameter]] = {}
        for stage in self.stages:
            for name, p in stage.named_parameters():
                seen.setdefault(id(p), (stage.global_name(name), p))
        return list(seen.values())


def _tied_zeros(model: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """A middle stage's (pp > 2) zeros for the tied gradient's all-reduce: it holds only a meta stand-in of the
    embedding, so the rows are those of the ends' shard for this rank's dp replica (``shard_rows``) of its tp
    index's vocabulary rows (the stand-in keeps the tp split), all of them without FSDP2 stages."""
    rows = local_tensor(weight).shape[0]
    meshes = (p.device_mesh for p in model.parameters() if isinstance(p, DTensor))
    dp = [mesh for mesh in meshes if mesh.mesh_dim_names == ("dp",)]
    if dp:
        rows = shard_rows(rows, dp[0].size(), dp[0].get_local_rank())
    return torch.zeros((rows, *weight.shape[1:]), dtype=weight.dtype, device=device_of(model))


def shard_rows(rows: int, shards: int, index: int) -> int:
    """Rows of shard ``index`` when FSDP2 splits ``rows`` over ``shards`` ranks along dim 0: ``torch.chunk``'s
    ceil(rows / shards) a shard, the last ones short or empty."""
    per = -(-rows // shards)
    return max(0, min(per, rows - index * per))


def _tied(model: torch.nn.Module) -> bool:
    return head.lm_head(model).weight is cast(Any, model).model.embed_tokens.weight
