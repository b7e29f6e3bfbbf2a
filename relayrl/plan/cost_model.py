"""What the simulator (``relayrl.plan.simulate``) asks of a cost model, and the two it has.

The simulator consumes the ``CostModel`` protocol: a generate call as a ``CallCost`` (its sequences, the
seconds that do not depend on the batch, and its decode steps, each as long as ``decode_step_s`` of the batch the
engine runs *then*: calls that share an engine slow each other as continuous batching does), and the other calls
as seconds. ``AnalyticCosts`` implements it from the formulas of ``relayrl.plan.costs``, ``ConstantCosts`` from
given seconds (the simulator's hand-checkable tests).

Completion lengths: every completion ``response_len`` tokens, or (``response_cv`` > 0) lognormal with mean
``response_len`` capped at ``response_max``, drawn per sequence: a call lasts until its longest ends, and
its sequences free their slots of the engine's batch in ``RELEASE_WAVES`` waves as they end
(``release_waves``), so a queued call starts and the tail decodes at a smaller batch, as continuous batching
does; the mean lengths (``mean_response``) set the training tokens.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from relayrl.plan.costs import (
    Cluster,
    Workload,
    checkpoint_s,
    decode_step_s,
    kv_seqs,
    lognormal_params,
    prefill_s,
    switch_s,
    sync_s,
    train_s,
)
from relayrl.plan.train_time import LayoutTraining

RELEASE_WAVES = 8
"""A call's sequences end in this many waves of (nearly) equal count, each freeing its slots when its longest
ends: close to per-sequence continuous batching at a bounded number of simulated events per call."""


@dataclass(frozen=True)
class CallCost:
    """One generate call on an engine: it occupies ``seqs`` of the engine's batch; it runs ``fixed_s`` seconds
    that do not depend on the batch (prefill, per-call cost), then ``steps`` decode steps, each lasting
    ``decode_step_s(b)`` of the batch b its engine runs at that moment. ``releases``: (decode steps done, how
    many of its sequences end then and free their slots), ascending and before ``steps``; the rest end with
    the call."""

    seqs: int
    fixed_s: float
    steps: float
    releases: tuple[tuple[float, int], ...] = ()


def release_waves(lengths: Sequence[float], waves: int = RELEASE_WAVES) -> tuple[tuple[float, int], ...]:
    """The ``CallCost.releases`` of sequences of these decode ``lengths``: sorted, cut into ``waves`` runs of
    nearly equal count, each ending at its longest; runs that end with the call's longest are left to it."""
    ordered, n = sorted(lengths), len(lengths)
    cuts = sorted({math.ceil(n * i / waves) for i in range(1, waves + 1)})
    out: list[tuple[float, int]] = []
    start = 0
    for cut in cuts:
        end_at = ordered[cut - 1]
        if end_at >= ordered[-1]:
            break
        if out and out[-1][0] == end_at:
            out[-1] = (end_at, out[-1][1] + cut - start)
        else:
            out.append((end_at, cut - start))
        start = cut
    return tuple(out)


class CostModel(Protocol):
    """What ``relayrl.plan.simulate`` asks of a cost model (seconds at full speed)."""

    @property
    def engine_seqs(self) -> int:
        """Sequences one engine runs at once; calls beyond wait in its queue."""

    @property
    def overlap_slowdown(self) -> float:
        """Separate placement: both sides this much slower while they overlap."""

    @property
    def completions_per_group(self) -> int:
        """G (throughput figures)."""

    @property
    def tokens_per_completion(self) -> float:
        """Completion tokens (throughput figures)."""

    def call(self, groups: int) -> CallCost: ...

    def decode_step_s(self, batch: int) -> float: ...

    def score_s(self, groups: int) -> float: ...

    def train_s(self, groups: int) -> float: ...

    def sync_s(self) -> float: ...

    def checkpoint_s(self) -> float: ...

    def switch_s(self) -> float: ...

    def restart_s(self) -> float: ...

    def overhead_s(self) -> float:
        """The driver's own work per step (logging, buffer calls), after each step's sync."""


@dataclass
class AnalyticCosts:
    """The formulas of ``relayrl.plan.costs`` for one ``Cluster`` and ``Workload``. A step's training comes from
    the trainer's layout (``training``, ``relayrl.plan.train_time``) when one is given, else from the assumed
    MFU (``costs.train_s``); ``train_s`` scales it by the groups the step took over B (a step takes >= B; more
    with dynamic sampling)."""

    cluster: Cluster
    workload: Workload
    training: LayoutTraining | None = None
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.workload.seed)

    @property
    def engine_seqs(self) -> int:
        return min(self.workload.max_num_seqs, kv_seqs(self.cluster, self.workload))

    @property
    def overlap_slowdown(self) -> float:
        return self.cluster.overlap_slowdown

    @property
    def completions_per_group(self) -> int:
        return self.workload.group_size

    @property
    def tokens_per_completion(self) -> float:
        return self.workload.mean_response

    def call(self, groups: int) -> CallCost:
        """A call of ``groups`` groups. Fixed lengths: ceil(n / max_num_seqs) waves of response_len decode steps.
        Lengths drawn (``response_cv`` > 0): a call that fits the engine's batch lasts its longest and frees its
        slots in waves (``release_waves``); a larger one lasts max(longest, sum / max_num_seqs) steps, refilling
        its own freed slots, and holds all of them until it ends."""
        wl, n = self.workload, groups * self.workload.group_size
        fixed = wl.gen_call_s + prefill_s(self.cluster.hardware, wl, groups, self.cluster.rollout_tp)
        if wl.response_cv <= 0:
            return CallCost(n, fixed, math.ceil(n / wl.max_num_seqs) * wl.response_len)
        mu, sigma = lognormal_params(wl.response_len, wl.response_cv)
        cap = wl.response_max or math.inf
        lengths = [min(cap, self._rng.lognormvariate(mu, sigma)) for _ in range(n)]
        if n > wl.max_num_seqs:
            return CallCost(n, fixed, max(max(lengths), sum(lengths) / wl.max_num_seqs))
        return CallCost(n, fixed, max(lengths), release_waves(lengths))

    def decode_step_s(self, batch: int) -> float:
        return decode_step_s(self.cluster.hardware, self.workload, batch, self.cluster.rollout_tp)

    def score_s(self, groups: int) -> float:
        return self.workload.score_s_per_group * groups

    def train_s(self, groups: int) -> float:
        wl = self.workload
        return wl.train_fixed_s + self.step_train_s() * groups / wl.prompts_per_step

    def step_train_s(self) -> float:
        """B groups' training, without ``train_fixed_s``: from the layout, or the assumed MFU."""
        wl = self.workload
        if self.training is None:
            return train_s(self.cluster, wl) - wl.train_fixed_s
        return self.training.seconds(self.cluster.hardware, wl)

    def sync_s(self) -> float:
        return sync_s(self.cluster, self.workload)

    def checkpoint_s(self) -> float:
        return checkpoint_s(self.cluster, self.workload)

    def switch_s(self) -> float:
        return switch_s(self.cluster, self.workload) if self.cluster.placement == "colocated" else 0.0

    def restart_s(self) -> float:
        return self.cluster.restart_s

    def overhead_s(self) -> float:
        return 0.0


@dataclass
class ConstantCosts:
    """Given seconds: every generate call takes ``generate`` (a sequence is cycled call by call, in launch order),
    every step ``train``, every sync ``sync``; calls never slow each other (no batch effects)."""

    generate: float | Sequence[float]
    train: float
    sync: float = 0.0
    score: float = 0.0
    checkpoint: float = 0.0
    switch: float = 0.0
    restart: float = 0.0
    overhead: float = 0.0
    overlap_slowdown: float = 1.0
    completions_per_group: int = 1
    tokens_per_completion: float = 0.0
    engine_seqs: int = 1 << 30
    _gen: itertools.cycle[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        gens = [float(self.generate)] if isinstance(self.generate, (int, float)) else list(self.generate)
        if not gens:
            raise ValueError("ConstantCosts.generate: give at least one duration")
        self._gen = itertools.cycle(gens)

    def call(self, groups: int) -> CallCost:
        return CallCost(groups, next(self._gen), 0.0)

    def decode_step_s(self, batch: int) -> float:
        return 0.0

    def score_s(self, groups: int) -> float:
        return self.score

    def train_s(self, groups: int) -> float:
        return self.train

    def sync_s(self) -> float:
        return self.sync

    def checkpoint_s(self) -> float:
        return self.checkpoint

    def switch_s(self) -> float:
        return self.switch

    def restart_s(self) -> float:
        return self.restart

    def overhead_s(self) -> float:
        return self.overhead
