"""Turn scored trajectory groups into the padded tensors of a ``TrainBatch``, and split it over ranks.

Alignment (one sequence, prompt length P, completion length T, ``x = prompt + completion``):

    position j of the [L-1] next-token axis scores token x[j+1]
    completion token k sits at x[P+k], so it is scored at j = P-1+k, k = 0..T-1
    loss_mask[j] = completion_mask[k] (1 when None) and behaviour_logprobs[j] = engine logprob of
    completion token k, for those j

In a multi-turn episode the completion interleaves model and environment tokens; ``completion_mask``
is 0 on the environment's, so they condition later turns but are never trained on (or counted).

Advantages come from ``ADVANTAGES[estimator]``, one per sequence; grouped estimators (GRPO, RLOO, ...)
compare each sequence with the rest of its ``TrajectoryGroup`` (the G samples of one prompt). A critic
estimator (``gae``) gets zeros here: the trainer fills per-token advantages once its critic has scored
the batch, from ``rewards`` (each sequence's reward, plus any ``reward_shaping`` term of its length).

Trajectories whose reward failed (``traj.excluded``) are left out before anything else
(``trainable_groups``), so group statistics are over the remaining samples only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from relayrl.algorithms.advantages import ADVANTAGES, CRITIC_ESTIMATORS, sequence_advantages
from relayrl.algorithms.filtering import trainable_groups
from relayrl.trainer.balance import split_units
from relayrl.trainer.packing import PackedRow, pack_rows, plan_chunks, segment_tokens
from relayrl.types import TrainBatch, Trajectory, TrajectoryGroup


def _check_trajectory(traj: Trajectory) -> None:
    if not traj.prompt_token_ids:
        raise ValueError(
            f"prompt {traj.prompt_id} sample {traj.sample_idx} has no prompt tokens; "
            "a completion needs at least one token to be conditioned on"
        )
    if len(traj.behaviour_logprobs) != len(traj.completion_token_ids):
        raise ValueError(
            f"prompt {traj.prompt_id} sample {traj.sample_idx}: {len(traj.behaviour_logprobs)} "
            f"behaviour logprobs for {len(traj.completion_token_ids)} completion tokens; "
            "request logprobs=0 from the engine so every sampled token has one"
        )
    mask = traj.completion_mask
    if mask is not None and (len(mask) != len(traj.completion_token_ids) or not set(mask) <= {0, 1}):
        raise ValueError(
            f"prompt {traj.prompt_id} sample {traj.sample_idx}: completion_mask must hold one 0/1 "
            f"per completion token ({len(traj.completion_token_ids)}), got {len(mask)} values "
            f"{sorted(set(mask))}; 1 marks model tokens, 0 environment tokens"
        )


def build_train_batch(
    groups: list[TrajectoryGroup],
    pad_token_id: int,
    estimator: str = "grpo",
    reward_shaping: Callable[[torch.Tensor], torch.Tensor] | None = None,
    whiten: str = "token",
) -> TrainBatch:
    """Concatenate prompt+completion, right-pad to the longest, and align masks/logprobs to next tokens.

    ``estimator`` names the advantage function in ``ADVANTAGES`` (or a ``CRITIC_ESTIMATORS`` one: zero
    advantages, filled later). The group of each sequence is its position in ``groups`` (so two groups
    of the same prompt, e.g. sampled at different policy versions, are normalised separately);
    ``prompt_ids`` records the prompts. Excluded trajectories are dropped first (``trainable_groups``).
    ``reward_shaping`` maps completion lengths in tokens [B] to a term added to each reward [B] (DAPO's
    ``shaping.overlong_penalty``) before advantages are computed.
    """
    if estimator not in ADVANTAGES and estimator not in CRITIC_ESTIMATORS:
        raise ValueError(
            f"advantage estimator {estimator!r} is not known; use one of {', '.join((*ADVANTAGES, *CRITIC_ESTIMATORS))}"
        )
    n_given = sum(len(g.trajectories) for g in groups)
    groups = trainable_groups(groups)
    trajs = [t for g in groups for t in g.trajectories]
    if not trajs:
        raise ValueError(
            f"build_train_batch got no trajectories to train on ({n_given} given; excluded ones and "
            "groups left with < 2 are dropped); pass at least one group with scored trajectories"
        )
    for t in trajs:
        _check_trajectory(t)
    seqs = [t.prompt_token_ids + t.completion_token_ids for t in trajs]
    B, L = len(seqs), max(len(s) for s in seqs)
    input_ids = torch.full((B, L), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.long)
    loss_mask = torch.zeros(B, L - 1, dtype=torch.float32)
    behaviour = torch.zeros(B, L - 1, dtype=torch.float32)
    for b, (t, seq) in enumerate(zip(trajs, seqs)):
        P, T = len(t.prompt_token_ids), len(t.completion_token_ids)
        input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[b, : len(seq)] = 1
        loss_mask[b, P - 1 : P - 1 + T] = (
            1.0 if t.completion_mask is None else torch.tensor(t.completion_mask, dtype=torch.float32)
        )
        behaviour[b, P - 1 : P - 1 + T] = torch.tensor(t.behaviour_logprobs, dtype=torch.float32)
    group_ids = torch.tensor([i for i, g in enumerate(groups) for _ in g.trajectories])
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float64)
    if reward_shaping is not None:
        rewards = rewards + reward_shaping(torch.tensor([len(t.completion_token_ids) for t in trajs]))
    advantages = (
        sequence_advantages(estimator, rewards, group_ids, loss_mask.sum(1), whiten)
        if estimator in ADVANTAGES
        else torch.zeros(B, dtype=torch.float32)
    )
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behaviour_logprobs=behaviour,
        advantages=advantages,
        prompt_ids=[t.prompt_id for t in trajs],
        rewards=rewards.to(torch.float32),
    )


def _rows(batch: TrainBatch, index: torch.Tensor) -> TrainBatch:
    return TrainBatch(
        input_ids=batch.input_ids[index],
        attention_mask=batch.attention_mask[index],
        loss_mask=batch.loss_mask[index],
        behaviour_logprobs=batch.behaviour_logprobs[index],
        advantages=batch.advantages[index],
        prompt_ids=[batch.prompt_ids[i] for i in index.tolist()],
        rewards=None if batch.rewards is None else batch.rewards[index],
    )


def _zero_weight_from(share: TrainBatch, start: int) -> TrainBatch:
    """``share`` with rows ``start:`` (filler copies) made to train on nothing: mask, advantage and
    reward 0, prompt id -1 (never a shared prefix with a real group)."""
    n_pad = len(share) - start
    if n_pad:
        share.loss_mask[start:] = 0.0
        share.advantages[start:] = 0.0
        if share.rewards is not None:
            share.rewards[start:] = 0.0
        share.prompt_ids[start:] = [-1] * n_pad
    return share


def _check_rank(rank: int, world_size: int) -> None:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")


def split_batch(batch: TrainBatch, rank: int, world_size: int) -> TrainBatch:
    """Rank ``rank``'s contiguous share, ``ceil(B / world_size)`` rows on every rank.

    FSDP2 runs collectives inside every forward/backward, so all ranks must make the same number of
    calls: a short share is topped up with copies of row 0 whose ``loss_mask`` and advantage are zero.
    Copies (not all-padding rows) keep attention well defined: a row with no real token can give NaN
    in attention, and NaN * 0 is still NaN in the gradient. Padding rows contribute exactly zero.
    """
    _check_rank(rank, world_size)
    per_rank = -(-len(batch) // world_size)
    index = torch.arange(rank * per_rank, min((rank + 1) * per_rank, len(batch)))
    n_pad = per_rank - len(index)
    share = _rows(batch, torch.cat([index, torch.zeros(n_pad, dtype=torch.long)]))
    return _zero_weight_from(share, len(index))


def balanced_split(batch: TrainBatch, rank: int, world_size: int, budget: int, share_prefix: bool) -> TrainBatch:
    """Rank ``rank``'s share for packed micro-batches: whole packing units, balanced by packed tokens.

    Units and costs are ``packing_units`` of the whole batch (one row; with ``share_prefix`` one group, or
    a part of one that fits ``budget``, whose rows share one prefix copy), assigned by ``assign_lpt``, and
    while the busiest rank holds over 1.05 times the mean its largest group is cut in halves, each with its own
    prefix copy (``split_units``): the same on every rank. The rank's rows keep their batch order. Row counts may differ
    across ranks: ``micro_batches`` evens out the forward counts. A rank given no unit gets one zero-weight
    copy of row 0 (as ``split_batch`` pads), so it still has a valid share to run its forwards on.
    The step's gradient is the same as any other split's: every row is on exactly one rank and the loss's
    denominator is the step's (``step_totals``).
    """
    _check_rank(rank, world_size)
    units, _ = packing_units(batch, budget, share_prefix)
    seqs = _sequences(batch)
    units, owner = split_units(units, lambda rows: segment_tokens([seqs[r] for r in rows], share_prefix), world_size)
    rows = sorted(r for unit, o in zip(units, owner) if o == rank for r in unit)
    if not rows:
        return _zero_weight_from(_rows(batch, torch.zeros(1, dtype=torch.long)), 0)
    return _rows(batch, torch.tensor(rows, dtype=torch.long))


def dp_share(batch: TrainBatch, rank: int, world_size: int, budget: int, share_prefix: bool) -> TrainBatch:
    """Rank ``rank``'s rows of the step: padded micro-batches (``budget`` 0) count forwards in rows, so every
    rank needs as many (``split_batch``); packed ones cost their tokens and ``micro_batches`` evens out their
    count, so rows go by tokens (``balanced_split``)."""
    if budget <= 0:
        return split_batch(batch, rank, world_size)
    return balanced_split(batch, rank, world_size, budget, share_prefix)


# ---------------------------------------------------------------------------------------- micro-batches
@dataclass
class MicroBatch(TrainBatch):
    """One forward/backward's rows: the padded tensors trimmed to them (``target_start`` set), and with
    packing their padding-free row (``packed``, on which the model runs; losses use the padded layout)."""

    packed: PackedRow | None = None


def _first_target(loss_mask: torch.Tensor) -> int:
    """First column where any row has a completion token (0 if none): [B, L-1] -> int."""
    cols = loss_mask.any(dim=0).nonzero()
    return int(cols[0]) if len(cols) else 0


def trimmed(share: TrainBatch, rows: list[int]) -> MicroBatch:
    """Rows ``rows`` cut to their longest sequence, loss columns from the first one any row scores."""
    part = _rows(share, torch.tensor(rows, dtype=torch.long))
    L = int(part.attention_mask.sum(1).max())
    first = _first_target(part.loss_mask[:, : L - 1])
    return MicroBatch(
        input_ids=part.input_ids[:, :L],
        attention_mask=part.attention_mask[:, :L],
        loss_mask=part.loss_mask[:, first : L - 1],
        behaviour_logprobs=part.behaviour_logprobs[:, first : L - 1],
        advantages=part.advantages,
        prompt_ids=part.prompt_ids,
        target_start=first,
        rewards=part.rewards,
    )


def row_micro_batches(share: TrainBatch, size: int) -> list[MicroBatch]:
    """Chunks of ``size`` rows, each trimmed to its longest sequence (right padding)."""
    return [trimmed(share, list(range(r, min(r + size, len(share))))) for r in range(0, len(share), size)]


def to_device(mb: MicroBatch, device: torch.device) -> MicroBatch:
    """``mb`` with every tensor on ``device``."""
    move = {
        f: getattr(mb, f).to(device)
        for f in ("input_ids", "attention_mask", "loss_mask", "behaviour_logprobs", "advantages")
    }
    return dataclasses.replace(
        mb,
        **move,
        rewards=None if mb.rewards is None else mb.rewards.to(device),
        packed=None if mb.packed is None else mb.packed.to(device),
    )


def _sequences(share: TrainBatch) -> list[list[int]]:
    return [ids[: int(n)].tolist() for ids, n in zip(share.input_ids, share.attention_mask.sum(1))]


def packing_units(share: TrainBatch, budget: int, share_prefix: bool) -> tuple[list[list[int]], list[int]]:
    """The rows that must stay together and their packed token counts: ([rows] per unit, [tokens]).

    Without ``share_prefix`` a unit is one sequence. With it, a unit is a run of rows with the same
    prompt id (one group; -1 marks padding rows, never shared), cut into runs of at most ``budget``
    packed tokens when the whole group does not fit (each part then holds its own prefix copy).
    """
    seqs = _sequences(share)
    if not share_prefix:
        return [[r] for r in range(len(share))], [len(s) for s in seqs]
    units: list[list[int]] = []
    for r, pid in enumerate(share.prompt_ids):
        unit = units[-1] if units else None
        if (
            unit
            and pid != -1
            and share.prompt_ids[unit[0]] == pid
            and segment_tokens([seqs[u] for u in [*unit, r]], True) <= budget
        ):
            unit.append(r)
        else:
            units.append([r])
    return units, [segment_tokens([seqs[r] for r in u], True) for u in units]


def packing_plan(
    share: TrainBatch, budget: int, share_prefix: bool
) -> tuple[list[list[int]], list[int], list[list[int]]]:
    """(units, their token costs, consecutive chunks of unit indexes of at most ``budget`` tokens)."""
    units, costs = packing_units(share, budget, share_prefix)
    return units, costs, plan_chunks(costs, budget)


def packed_micro_batch(share: TrainBatch, units: list[list[int]], share_prefix: bool) -> MicroBatch:
    """The rows of ``units`` as a ``MicroBatch`` whose ``packed`` row holds them without padding."""
    rows = [r for u in units for r in u]
    mb = trimmed(share, rows)
    seqs = _sequences(mb)
    index = {r: i for i, r in enumerate(rows)}
    mb.packed = pack_rows(seqs, [[index[r] for r in u] for u in units], mb.loss_mask, mb.target_start, share_prefix)
    return mb


def empty_micro_batch(share: TrainBatch, share_prefix: bool) -> MicroBatch:
    """Row 0 with nothing to train on (mask, advantage, reward 0): evens out forwards across ranks."""
    mb = packed_micro_batch(share, [[0]], share_prefix)
    mb.loss_mask.zero_()
    mb.advantages = torch.zeros_like(mb.advantages)
    mb.rewards = None if mb.rewards is None else torch.zeros_like(mb.rewards)
    mb.prompt_ids = [-1]
    assert mb.packed is not None  # packed_micro_batch made it
    mb.packed.gather.fill_(-1)
    return mb


def forward_tokens(mb: MicroBatch) -> int:
    """Tokens ``mb``'s forward runs over: its packed row's length, or padded rows x their trimmed length."""
    return mb.packed.n_tokens if mb.packed is not None else int(mb.input_ids.numel())


def fetch_groups(group_refs: list) -> list[TrajectoryGroup]:
    """The step's groups from Ray ObjectRefs of ``list[TrajectoryGroup]`` (one per replica; plain lists pass
    through), fetched in one ``ray.get`` on the rank so trajectory data never passes through the driver."""
    import ray

    refs = [r for r in group_refs if isinstance(r, ray.ObjectRef)]
    fetched = iter(ray.get(refs)) if refs else iter(())
    parts = [next(fetched) if isinstance(r, ray.ObjectRef) else r for r in group_refs]
    return [g for part in parts for g in part]


def micro_batches(
    share: TrainBatch,
    micro_batch_size: int,
    budget: int,
    share_prefix: bool,
    device: torch.device,
    all_reduce: Callable,
    count_multiple: int = 1,
) -> list[MicroBatch]:
    """One rank's micro-batches on ``device``: chunks of ``micro_batch_size`` padded rows, or with a token
    ``budget`` (``max_tokens_per_micro_batch`` > 0) packed rows of at most that many tokens (``share_prefix``:
    each group's prompt once). Collective when packing (``all_reduce(value, op)`` over the dp ranks): every dp
    rank runs as many micro-batches as the busiest (FSDP gathers in each forward), rounded up to a multiple of
    ``count_multiple`` (pipeline stages: at least one a stage, whole rounds under interleaving), splitting its own
    chunks first and adding micro-batches with nothing to train on only when it has too few rows."""
    import torch.distributed as dist

    from relayrl.trainer.packing import split_to_count

    if budget <= 0:
        return [to_device(mb, device) for mb in row_micro_batches(share, micro_batch_size)]
    units, costs, chunks = packing_plan(share, budget, share_prefix)
    count = int(all_reduce(torch.tensor(float(len(chunks))), dist.ReduceOp.MAX))
    count = -(-count // count_multiple) * count_multiple
    chunks = split_to_count(chunks, costs, count)
    out = [packed_micro_batch(share, [units[u] for u in chunk], share_prefix) for chunk in chunks]
    out += [empty_micro_batch(share, share_prefix) for _ in range(count - len(out))]
    return [to_device(mb, device) for mb in out]
