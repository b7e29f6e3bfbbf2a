"""Packed rows (``trainer.max_tokens_per_micro_batch`` > 0) through pipeline stages.

A pipeline schedule sends every micro-batch's activations with one shape, so each micro-batch's padding-free row
(``packing.py``: its sequences end to end, each group's prompt once with ``trainer.shared_prefix``) is padded at
its end to the step's longest row, n tokens. The pad tail is a segment of its own that nothing scores: its keys are
in no other segment, so the real tokens' hidden states are those of the unpadded row.

The schedule splits a micro-batch index [m] (the keyword ``mb``) like the input, and hands each stage's forward its
micro-batch's index: the stage looks up the row's position ids and attention spans (``PackedInput``), which every
rank of a pipeline computes for itself from the same rows (nothing but hidden states crosses a stage boundary).
The last stage's loss is handed the index as its target: it scores the row's K entries through the chunked head,
lays them out as the micro-batch's [b, T] loss columns (``packing.place``) and runs ``pipeline.token_loss`` on
them, the loss ``PolicyStep.train_micro`` computes for the same packed micro-batch on one rank. A negative index
(a forward-only pass) skips the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from relayrl.algorithms.objective import Objective
from relayrl.trainer import attention, head
from relayrl.trainer.batch import MicroBatch
from relayrl.trainer.packing import PackedRow, place
from relayrl.trainer.pipeline import LossFn, token_loss
from relayrl.trainer.step import StepStats


class PackedInput(NamedTuple):
    """What a stage needs of one packed micro-batch besides its hidden states."""

    positions: torch.Tensor  # [1, n] each token's position in its sequence (the pad tail counts on)
    spans: tuple[attention.Span, ...]  # the row's attention spans (``attention.spans``)


def packed_row(mb: MicroBatch) -> PackedRow:
    if mb.packed is None:
        raise ValueError("a packed pipeline step needs packed micro-batches (trainer.max_tokens_per_micro_batch > 0)")
    return mb.packed


def packed_inputs(micro: list[MicroBatch], pad_id: int) -> tuple[torch.Tensor, list[PackedInput]]:
    """(token ids [m, n] of every micro-batch's row padded to the longest, n tokens; each row's ``PackedInput``)."""
    n = max(packed_row(mb).n_tokens for mb in micro)
    ids, inputs = [], []
    for mb in micro:
        row = packed_row(mb)
        extra, device = n - row.n_tokens, row.input_ids.device
        tail = torch.arange(extra, device=device)
        ids.append(torch.cat([row.input_ids, torch.full((1, extra), pad_id, device=device, dtype=torch.long)], 1))
        segment = torch.cat([row.segment, torch.full((extra,), int(row.segment.max()) + 1, device=device)])
        branch = torch.cat([row.branch, torch.zeros(extra, device=device, dtype=row.branch.dtype)])
        positions = torch.cat([row.position_ids, tail[None]], 1)
        inputs.append(PackedInput(positions, attention.spans(segment, branch)))
    return torch.cat(ids), inputs


def scored(
    hidden: torch.Tensor, row: PackedRow, lm_head: Any, request: head.Request
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropies), each [b, T] in the loss layout, of a packed row's entries from its final hidden
    states [1, n, H] (``request.targets``: the row's entry targets [1, K])."""
    logprobs, entropy = head.head_scores(lm_head, hidden[:, row.score_pos], request)
    return place(logprobs[0], row.gather), place(entropy[0], row.gather)


def packed_loss(
    objective: Objective,
    temperature: float,
    chunk: int,
    denominator: torch.Tensor,
    micro: list[MicroBatch],
    old: list[torch.Tensor] | None,
    ref: list[torch.Tensor] | None,
    record: Callable[[StepStats], None] | None = None,
) -> Callable:
    """The last stage's loss of packed micro-batch ``target`` (its index, module docstring): ``old`` and ``ref``
    are each micro-batch's pi_old and reference logprobs [b, T] (None: pi_old is this forward's own, detached; no
    reference)."""

    def make(lm_head: Any) -> LossFn:
        def loss_fn(hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            i = int(target.reshape(-1)[0])
            if i < 0:  # a forward-only pass: nothing to score here
                return hidden.sum() * 0
            mb = micro[i]
            row = packed_row(mb)
            request = head.Request(row.score_target[None], temperature, chunk, objective.entropy_coef > 0)
            logprobs, entropy = scored(hidden, row, lm_head, request)
            pi_old = logprobs.detach() if old is None else old[i]
            return token_loss(
                objective, logprobs, entropy, pi_old, None if ref is None else ref[i], mb, denominator, record
            )

        return loss_fn

    return make
