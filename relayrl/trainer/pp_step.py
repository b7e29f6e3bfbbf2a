"""The policy's update under pipeline parallelism (``trainer.pp_size`` > 1), in place of ``PolicyStep.epochs``.

The ranks form a ("dp", "pp") mesh. The ranks of a pipeline hold the same rows (their dp share of the step)
and each its own stages of the policy (``pipeline.py``), and only those stages' weights: the decoder layers sharded
with FSDP2 over the dp replicas of its stages (``pp_weights.shard_stages``: each keeps 1/dp of them but the final
norm). A step, on every rank:

    rows = the batch's padded rows, trimmed to its longest; m micro-batches of equal rows (filler rows masked
           out), m = max(pp_size, ceil(rows / micro_batch_size)), a multiple of pp_size under the looped
           schedules (interleaved, zero bubble); or
           the rank's packed micro-batches (a multiple of pp_size of them), each padded at its end to the longest
           (``pp_packed.py``)
    old logprobs = with one epoch the training forward's own (detached), as one rank's; with more, one
                   forward-only pass of the schedule first; with GRPO's KL term the reference's, through its
                   stages (PPO's KL penalty is in the reward: ``scores`` gives its critic pi_old's and the
                   reference's logprobs, through the stages, before the epochs)
    for epoch in 1..E: schedule.step (forward and backward of every micro-batch; the loss on the last stage:
                       policy loss, LOSS_AGG numerator · dp / D_step); gradients averaged over dp (FSDP2's
                       reduce-scatter, an all-reduce for the final norm), which makes the replicas' sum the
                       step's gradient; global-norm clip; AdamW on each shard
    stats: the last stage's ``StepStats`` sums, broadcast to every rank of its pipeline

Each rank holds only its own stages' weights (``pp_weights.load_stages``). What reads the whole policy
gathers it one parameter at a time from the ranks holding it: weight sync (``weightsync/stages.py``), the trainer's
state dict and ``save_hf`` (``full_state_dict``); the post-sync probe scores through the stages
(``sequence_logprobs``). The stages are rebuilt each step: a step's row length sets the shapes every stage sends
and receives.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from relayrl.algorithms.objective import Objective
from relayrl.config import TrainerConfig
from relayrl.config.trainer import LOOPED
from relayrl.trainer import head, pp_weights
from relayrl.trainer.batch import MicroBatch
from relayrl.trainer.optim import local_tensor
from relayrl.trainer.pipeline import Pipeline, device_of, rl_loss, targets
from relayrl.trainer.pp_packed import PackedInput, packed_inputs, packed_loss, packed_row, scored
from relayrl.trainer.precision import autocast
from relayrl.trainer.step import StepStats
from relayrl.types import TrainBatch


def micro_batch_count(rows: int, micro_batch_size: int, pp_size: int, schedule: str) -> int:
    """m: at least one micro-batch a stage and at most ``micro_batch_size`` rows each; interleaved 1F1B
    and zero bubble run rounds of pp_size micro-batches, so m is rounded up to a multiple of it."""
    m = max(pp_size, math.ceil(rows / micro_batch_size))
    return math.ceil(m / pp_size) * pp_size if schedule in LOOPED else m


def padded_rows(batch: TrainBatch, count: int, pad_id: int) -> TrainBatch:
    """``batch`` trimmed to its longest sequence and grown to ``count`` rows with filler rows whose every
    token is masked out (they add nothing to the loss or its gradient)."""
    length = int(batch.attention_mask.sum(1).max())
    extra = count - len(batch)

    def grow(x: torch.Tensor, fill: float) -> torch.Tensor:
        return torch.cat([x, x.new_full((extra, *x.shape[1:]), fill)]) if extra else x

    advantages = batch.advantages[:, : length - 1] if batch.advantages.dim() == 2 else batch.advantages
    return dataclasses.replace(
        batch,
        input_ids=grow(batch.input_ids[:, :length], pad_id),
        attention_mask=grow(batch.attention_mask[:, :length], 0),
        loss_mask=grow(batch.loss_mask[:, : length - 1], 0),
        behaviour_logprobs=grow(batch.behaviour_logprobs[:, : length - 1], 0),
        advantages=grow(advantages, 0),
        prompt_ids=batch.prompt_ids + [-1] * extra,
    )


@dataclass
class PipelinedPolicy:
    """The policy's pipeline stages on this rank and how a step trains them (module docstring)."""

    model: torch.nn.Module
    cfg: TrainerConfig
    objective: Objective
    temperature: float
    pad_id: int
    ref_model: torch.nn.Module | None = None  # algorithm.kl_coef > 0: the frozen reference, cut the same way
    pp_group: dist.ProcessGroup | None = None  # this rank's pipeline (None: every rank)
    dp_group: dist.ProcessGroup | None = None  # the ranks holding the same stages (None: this rank alone)
    kl_in_reward: bool = False  # PPO: the KL penalty is in the critic's reward (``scores``), none in the loss

    def __post_init__(self) -> None:
        self.owner = pp_weights.owners(self.model, self.cfg.pp_size, self.cfg.pp_virtual_stages)
        if self.kl_in_reward:
            self.objective = dataclasses.replace(self.objective, kl_coef=0.0)

    def epochs(
        self, batch: TrainBatch, micro: list[MicroBatch], optimizer: torch.optim.Optimizer, denom: torch.Tensor
    ) -> tuple[StepStats, list[float]]:
        """``trainer.epochs`` clipped AdamW steps on ``batch`` (padded rows), or on its packed micro-batches
        ``micro`` when packing; (summed stats, the same on every rank; each epoch's pre-clip gradient norm)."""
        c = self.cfg
        records: list[StepStats] = []
        denom = denom / self._dp_size()  # FSDP2 averages the replicas' gradients: the sum is the step's
        if micro and micro[0].packed is not None:
            pipe, ids, target, packed = self._packed(micro, denom, records.append)
        else:
            pipe, ids, target = self._padded(batch, denom, records.append)
            packed = None
        sums: list[StepStats] = []
        norms = []
        for _ in range(c.epochs):
            records.clear()
            with autocast(ids.device.type, c.dtype):
                pipe.step(ids, target, packed)  # target None off the last stage: only it takes one
            # a schedule's first step also calls the loss once on its own to infer shapes: the last m are real
            sums += records[-pipe.micro_batches :]
            self._average_replicated(pipe)
            norms.append(pipe.clip_and_step(optimizer, c.grad_clip))
        return self._broadcast(sums, pipe.last, ids.device, pipe.group), norms

    def _padded(
        self, batch: TrainBatch, denom: torch.Tensor, record: Callable[[StepStats], None]
    ) -> tuple[Pipeline, torch.Tensor, torch.Tensor | None]:
        """(pipeline, token ids, the last stage's target) of padded rows (module docstring)."""
        c, group = self.cfg, self.pipeline_group()
        m = micro_batch_count(len(batch), c.micro_batch_size, c.pp_size, c.pp_schedule)
        rows = padded_rows(batch, math.ceil(len(batch) / m) * m, self.pad_id)
        ids = rows.input_ids.to(device_of(self.model))
        loss = rl_loss(self.objective, self.temperature, c.logits_chunk, denom, record)
        pipe = Pipeline(self.model, group, loss, m, c.pp_schedule, c.pp_virtual_stages)
        with autocast(ids.device.type, c.dtype):
            # one epoch: pi_old is the training forward's own logprobs (NaN asks the loss for them, as one rank's
            # first epoch does); more: one forward-only pass first, since later epochs need them fixed
            old = pipe.logprobs(ids, self.temperature, c.logits_chunk) if c.epochs > 1 else None
        ref = self._reference(group, ids, m)
        return pipe, ids, self._target(rows, old, ref) if pipe.last else None

    def _packed(
        self, micro: list[MicroBatch], denom: torch.Tensor, record: Callable[[StepStats], None]
    ) -> tuple[Pipeline, torch.Tensor, torch.Tensor | None, list[PackedInput]]:
        """(pipeline, token ids, the last stage's target: the micro-batch indexes, each row's ``PackedInput``) of
        packed micro-batches (``pp_packed.py``); pi_old and the reference as in ``_padded``."""
        c, group = self.cfg, self.pipeline_group()
        ids, packed = packed_inputs(micro, self.pad_id)
        old = self._packed_logprobs(self.model, ids, packed, micro) if c.epochs > 1 else None
        kl = self.ref_model is not None and self.objective.kl_coef > 0
        ref = self._packed_logprobs(self.ref_model, ids, packed, micro) if kl else None
        loss = packed_loss(self.objective, self.temperature, c.logits_chunk, denom, micro, old, ref, record)
        pipe = Pipeline(self.model, group, loss, len(micro), c.pp_schedule, c.pp_virtual_stages)
        target = torch.arange(len(micro), device=ids.device, dtype=torch.float32)[:, None] if pipe.last else None
        return pipe, ids, target, packed

    def _packed_logprobs(
        self, model: Any, ids: torch.Tensor, packed: list[PackedInput], micro: list[MicroBatch]
    ) -> list[torch.Tensor] | None:
        """``model``'s logprobs of each packed micro-batch, [b, T] each, through this rank's stages of it (forward
        only), on the rank holding the last stage; None elsewhere."""
        c = self.cfg
        unused = packed_loss(self.objective, self.temperature, c.logits_chunk, torch.ones(()), micro, None, None)
        pipe = Pipeline(model, self.pipeline_group(), unused, len(micro), c.pp_schedule, c.pp_virtual_stages)
        with torch.no_grad(), autocast(ids.device.type, c.dtype):
            out = pipe.forward_only(ids, packed)
            if out is None:
                return None
            lm, rows = head.lm_head(model), [packed_row(mb) for mb in micro]
            requests = [head.Request(row.score_target[None], self.temperature, c.logits_chunk) for row in rows]
            return [scored(out[i : i + 1], row, lm, r)[0].float() for i, (row, r) in enumerate(zip(rows, requests))]

    def pipeline_group(self) -> dist.ProcessGroup:
        group = self.pp_group or dist.group.WORLD
        assert group is not None
        return group

    @staticmethod
    def with_advantages(share: TrainBatch, micro: list[MicroBatch]) -> TrainBatch:
        """``share`` with PPO's per-token advantages, which ``Critic.advantages`` wrote into each padded
        micro-batch (consecutive rows of ``share``, columns from its ``target_start``), laid out [B, L - 1]."""
        advantages = torch.zeros_like(share.loss_mask, dtype=torch.float32)
        row = 0
        for mb in micro:
            n, width = mb.advantages.shape
            advantages[row : row + n, mb.target_start : mb.target_start + width] = mb.advantages.cpu()
            row += n
        return dataclasses.replace(share, advantages=advantages)

    def full_state_dict(self, keep: bool) -> dict[str, torch.Tensor]:
        """The whole policy's CPU state dict, kept where ``keep`` (``pp_weights.full_state_dict``). Collective."""
        return pp_weights.full_state_dict(self.model, self.owner, self.pipeline_group(), keep)

    @torch.no_grad()
    def sequence_logprobs(self, ids: torch.Tensor, temperature: float) -> torch.Tensor:
        """Logprobs [1, T − 1] of each token of ``ids`` [1, T] after the first, through the stages (forward only: one
        micro-batch under GPipe; with virtual stages, the row repeated over one round of pp_size micro-batches of
        interleaved 1F1B), from the last stage to every rank of the pipeline. Collective."""
        c, group = self.cfg, self.pipeline_group()
        unused = rl_loss(self.objective, temperature, c.logits_chunk, torch.ones(()))
        m, schedule = (1, "gpipe") if c.pp_virtual_stages == 1 else (c.pp_size, "interleaved")
        pipe = Pipeline(self.model, group, unused, m, schedule, c.pp_virtual_stages)
        with autocast(ids.device.type, c.dtype):
            out = pipe.logprobs(ids.expand(m, -1).contiguous(), temperature, c.logits_chunk)
        row = out[:1].float() if out is not None else ids.new_zeros(1, ids.shape[1] - 1, dtype=torch.float32)
        dist.broadcast(row, src=dist.get_global_rank(group, dist.get_world_size(group) - 1), group=group)
        return row

    def _average_replicated(self, pipe: Pipeline) -> None:
        """The gradients of the weights the dp replicas each keep whole (the final norm, ``pp_weights.load_stages``)
        averaged over the replicas, as FSDP2 averages the sharded ones' with its reduce-scatter."""
        dp = self._dp_size()
        if dp == 1:
            return
        for _, p in pipe.named_parameters():
            if p.grad is not None and not _sharded_over_dp(p.grad):
                grad = local_tensor(p.grad)
                dist.all_reduce(grad, group=self.dp_group)
                grad.div_(dp)

    def _dp_size(self) -> int:
        """Data-parallel replicas of this rank's stages (``pp_weights.shard_stages`` shards them over these)."""
        return 1 if self.dp_group is None else dist.get_world_size(self.dp_group)

    def _reference(self, group: dist.ProcessGroup, ids: torch.Tensor, m: int) -> torch.Tensor | None:
        """GRPO's KL term: the reference's logprobs on the last stage (forward only through its own stages), else
        None (no KL term in the loss: PPO's is in the reward, ``scores``)."""
        if self.ref_model is None or self.objective.kl_coef <= 0:
            return None
        return self._logprobs(self.ref_model, group, ids, m)

    def _logprobs(self, model: torch.nn.Module, group: dist.ProcessGroup, ids: torch.Tensor, m: int) -> torch.Tensor:
        """``model``'s logprobs [rows, T − 1] of padded ``ids`` through this rank's stages of it, in ``m``
        micro-batches, on the rank holding the last stage (forward only; an empty tensor elsewhere)."""
        c = self.cfg
        unused = rl_loss(self.objective, self.temperature, c.logits_chunk, torch.ones(()))
        pipe = Pipeline(model, group, unused, m, c.pp_schedule, c.pp_virtual_stages)
        with autocast(ids.device.type, c.dtype):
            out = pipe.logprobs(ids, self.temperature, c.logits_chunk)
        return ids.new_empty(0, dtype=torch.float32) if out is None else out.float()

    def scores(self, share: TrainBatch, micro: list[MicroBatch]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """PPO's KL penalty in the reward: (pi_old's, the reference's) logprobs of each micro-batch of ``share``
        (padded: consecutive rows; or packed), laid out as its ``loss_mask``, each model forward only through this
        rank's stages, broadcast from the last stage to every rank of the pipeline (each runs its whole critic)."""
        assert self.ref_model is not None, "PPO's KL penalty needs the reference model"
        c, group, models = self.cfg, self.pipeline_group(), (self.model, self.ref_model)
        if micro and micro[0].packed is not None:
            ids, packed = packed_inputs(micro, self.pad_id)
            scores = [self._packed_logprobs(model, ids, packed, micro) for model in models]
        else:
            m = micro_batch_count(len(share), c.micro_batch_size, c.pp_size, c.pp_schedule)
            rows = padded_rows(share, math.ceil(len(share) / m) * m, self.pad_id)
            ids = rows.input_ids.to(device_of(self.model))
            padded = [self._logprobs(model, group, ids, m) for model in models]
            scores = [self._per_micro(x, micro) if x.numel() else None for x in padded]
        return self._from_last(scores[0], micro), self._from_last(scores[1], micro)

    def _from_last(self, values: list[torch.Tensor] | None, micro: list[MicroBatch]) -> list[torch.Tensor]:
        """Each micro-batch's [b, T] ``values``, given on the rank holding the last stage (None elsewhere),
        broadcast to every rank of the pipeline."""
        group, shapes = self.pipeline_group(), [mb.loss_mask.shape for mb in micro]
        device = micro[0].loss_mask.device
        if values is not None:
            flat = torch.cat([v.reshape(-1).float() for v in values])
        else:
            flat = torch.zeros(sum(shape.numel() for shape in shapes), device=device)
        dist.broadcast(flat, src=dist.get_global_rank(group, dist.get_world_size(group) - 1), group=group)
        return [x.reshape(shape) for x, shape in zip(flat.split([shape.numel() for shape in shapes]), shapes)]

    @staticmethod
    def _per_micro(rows: torch.Tensor, micro: list[MicroBatch]) -> list[torch.Tensor]:
        """[B, L − 1] values of consecutive rows -> each micro-batch's [b, T] from its ``target_start`` (the
        inverse of ``with_advantages``' layout)."""
        out, row = [], 0
        for mb in micro:
            n, width = mb.loss_mask.shape
            out.append(rows[row : row + n, mb.target_start : mb.target_start + width])
            row += n
        return out

    def _target(self, rows: TrainBatch, old: torch.Tensor | None, ref: torch.Tensor | None) -> torch.Tensor:
        advantages = rows.advantages
        if advantages.dim() == 1:
            advantages = advantages[:, None].expand_as(rows.loss_mask)
        device = device_of(self.model)
        if old is None:
            old = torch.full(rows.loss_mask.shape, float("nan"), device=device)
        return targets(
            rows.input_ids.to(device),
            advantages.to(device, torch.float32),
            old.float(),
            rows.loss_mask.to(device, torch.float32),
            rows.behaviour_logprobs.to(device, torch.float32),
            None if ref is None else ref.float(),
        )

    @staticmethod
    def _broadcast(sums: list[StepStats], last: bool, device: torch.device, group: dist.ProcessGroup) -> StepStats:
        """The last stage's summed stats on every rank of the pipeline (the last stage is on its last rank)."""
        total = StepStats.zeros(device)
        for s in sums:
            total.add_(s)
        fields = [f.name for f in dataclasses.fields(StepStats)]
        packed = torch.stack([getattr(total, f).detach().float() for f in fields])
        if not last:
            packed = torch.zeros_like(packed)
        dist.broadcast(packed, src=dist.get_global_rank(group, dist.get_world_size(group) - 1), group=group)
        values: dict[str, Any] = dict(zip(fields, packed.unbind()))
        return StepStats(**values)


def _sharded_over_dp(grad: torch.Tensor) -> bool:
    """Whether ``grad`` is an FSDP2 shard over the "dp" mesh dimension (reduced by FSDP2 itself)."""
    return isinstance(grad, DTensor) and "dp" in (grad.device_mesh.mesh_dim_names or ())
