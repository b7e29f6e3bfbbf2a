"""Cost models for the simulator (``relayrl.plan.simulate``): what each call of the training loop costs.

Pure functions of a ``Hardware`` (one accelerator), a ``Cluster`` (how many of them, on which side, the links)
and a ``Workload`` (the model and one step's work). Every formula is written here so it can be checked by hand;
constants that are assumed rather than measured say so. With P parameters, b sequences in an engine's batch,
``c = prompt_len + response_len / 2`` their mean context (tokens), F = ``peak_flops``, W = ``bytes_per_param`` · P::

    prefill_s(g groups)   = 2 · P · g · prompt_len / (F · gen_mfu)        a group's prompt is prefilled once
                                                                           (prefix caching shares it with its G
                                                                           completions)
    decode_step_s(b)      = max((W + b · c · kv_bytes_per_token) / (hbm_bytes_per_s · hbm_efficiency),
                                2 · P · b / (F · gen_mfu)) + step_overhead_s
                                                                           a step reads every weight and each
                                                                           sequence's KV cache once (memory), or
                                                                           is bound by its FLOPs (compute)
    saturation_batch      = b where the two terms meet: W / (2 · P · B_hbm / (F · gen_mfu) − c · kv)
                            (B_hbm = the achieved HBM bandwidth; infinite when KV reads grow faster than FLOPs)
    decode_tokens_per_s(b) = b / decode_step_s(b)                          grows ~linearly up to the saturation
                                                                           batch, then flattens at
                                                                           F · gen_mfu / (2 · P)
    generate_s(g groups)  = prefill_s(g) + waves · response_len · decode_step_s(min(n, max_num_seqs)),
                            n = g · G sequences, waves = ceil(n / max_num_seqs)
                                                                           one call alone on one engine; every
                                                                           completion is response_len long, a
                                                                           partial last wave costs a full one
    train_s               = (6 + 2 · extra_forwards) · P · T / (F · mfu · trainer_devices) + train_fixed_s,
                            T = B · (prompt_len + G · response_len)        packed rows, each group's prompt once
    sync_s                = W / link_bytes_per_s + sync_latency_s           link: NVLink when rollout and trainer
                                                                           devices fit in one node, else IB
    checkpoint_s          = checkpoint_bytes_per_param · P / checkpoint_bytes_per_s   (driver stall of a save)
    score_s(g groups)     = score_s_per_group · g

What the simulator consumes is the ``CostModel`` protocol: a generate call as a ``CallCost`` (its sequences, the
seconds that do not depend on the batch, and its decode steps, each as long as ``decode_step_s`` of the batch the
engine runs *then*: calls that share an engine slow each other as continuous batching does), and the other calls
as seconds. ``AnalyticCosts`` implements it from the formulas above, ``ConstantCosts`` from given seconds (the
simulator's hand-checkable tests).

Not modelled yet: tensor parallelism inside a replica, response-length distributions (every completion is
``response_len`` tokens), chunked prefill interleaved with decode (a call's prefill runs before its decode and
does not slow the other calls on its engine), the reward pool's width (every scoring call runs at once).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Hardware:
    """One accelerator. Peak figures are datasheet numbers; the efficiencies are assumptions to calibrate."""

    name: str = "h100-sxm"
    peak_flops: float = 989e12  # dense BF16 FLOP/s
    hbm_bytes_per_s: float = 3.35e12
    nvlink_bytes_per_s: float = 450e9  # one direction, device to device inside a node
    ib_bytes_per_s: float = 50e9  # one 400 Gb/s NIC, between nodes
    mfu: float = 0.4  # training: achieved / peak FLOP/s (assumed)
    gen_mfu: float = 0.5  # prefill and compute-bound decode (assumed)
    hbm_efficiency: float = 0.8  # decode: achieved / peak HBM bandwidth (assumed)
    step_overhead_s: float = 0.0  # per decode step: scheduling, sampling, kernel launches (assumed 0)


H100 = Hardware()


@dataclass(frozen=True)
class Cluster:
    """Devices and links: one rollout replica per rollout device (no tensor parallelism yet), FSDP ranks on the
    trainer devices. ``placement="colocated"`` time-shares the same devices (give both counts equal)."""

    hardware: Hardware = H100
    rollout_devices: int = 1
    trainer_devices: int = 1
    placement: str = "separate"  # separate | colocated
    gpus_per_node: int = 8
    sync_latency_s: float = 0.0  # per sync: pause, version check, commit (assumed 0)
    checkpoint_bytes_per_s: float = 2e9  # aggregate write speed of a checkpoint's shards
    switch_s: float = 0.0  # colocated: one hand-over (engines sleep / wake, trainer off/onloads)
    restart_s: float = 0.0  # a dead replica's replacement, start to synced (the driver waits for it)
    overlap_slowdown: float = 1.0  # s: both sides this much slower while they overlap (1 on GPUs; CPU: plan.model)

    def __post_init__(self) -> None:
        if self.placement not in ("separate", "colocated"):
            raise ValueError(f"placement={self.placement!r}: separate | colocated")
        if self.rollout_devices < 1 or self.trainer_devices < 1:
            raise ValueError("a cluster needs >= 1 rollout and >= 1 trainer device")

    @property
    def one_node(self) -> bool:
        """The sync stays on NVLink: colocated, or both sides fit in one node."""
        return self.placement == "colocated" or self.rollout_devices + self.trainer_devices <= self.gpus_per_node

    @property
    def link_bytes_per_s(self) -> float:
        hw = self.hardware
        return hw.nvlink_bytes_per_s if self.one_node else hw.ib_bytes_per_s


@dataclass(frozen=True)
class Workload:
    """The model and one step's work: B prompts (groups) of G completions, every completion ``response_len``."""

    params: float  # P
    prompt_len: int
    response_len: int
    prompts_per_step: int  # B
    group_size: int  # G
    bytes_per_param: float = 2.0  # BF16 weights: what a decode step reads and a sync moves
    kv_bytes_per_token: float = 0.0  # KV cache per sequence per context token (2 · layers · kv_heads · head_dim · 2)
    max_num_seqs: int = 256  # an engine's batch cap (vLLM ``max_num_seqs``; relayrl's ``rollout.in_flight``)
    extra_forwards: int = 0  # forward passes besides the update's (e.g. 1: reference logprobs for a KL term)
    train_fixed_s: float = 0.0  # per step: batch fetch, driver <-> rank round trip
    gen_call_s: float = 0.0  # per generate call: RPC, tokenisation (added to its prefill)
    score_s_per_group: float = 0.0
    checkpoint_bytes_per_param: float = 14.0  # BF16 weights + FP32 master weights and Adam's two moments

    @property
    def weight_bytes(self) -> float:
        return self.bytes_per_param * self.params

    @property
    def train_tokens(self) -> float:
        """T = B · (prompt_len + G · response_len): packed rows carry each group's prompt once."""
        return self.prompts_per_step * (self.prompt_len + self.group_size * self.response_len)

    @property
    def mean_context(self) -> float:
        """c: a sequence's mean context over its decode, prompt_len + response_len / 2."""
        return self.prompt_len + self.response_len / 2


# ---- the formulas ------------------------------------------------------------------------------------------
def prefill_s(hw: Hardware, wl: Workload, groups: int) -> float:
    """2 · P · groups · prompt_len / (F · gen_mfu)."""
    return 2 * wl.params * groups * wl.prompt_len / (hw.peak_flops * hw.gen_mfu)


def decode_step_s(hw: Hardware, wl: Workload, batch: int) -> float:
    """One decode step of ``batch`` sequences: max(memory, compute) + step overhead (module docstring)."""
    memory = (wl.weight_bytes + batch * wl.mean_context * wl.kv_bytes_per_token) / (
        hw.hbm_bytes_per_s * hw.hbm_efficiency
    )
    compute = 2 * wl.params * batch / (hw.peak_flops * hw.gen_mfu)
    return max(memory, compute) + hw.step_overhead_s


def saturation_batch(hw: Hardware, wl: Workload) -> float:
    """The batch where a decode step turns compute bound (memory term = compute term); ``inf`` if it never does."""
    per_seq = 2 * wl.params * hw.hbm_bytes_per_s * hw.hbm_efficiency / (hw.peak_flops * hw.gen_mfu)
    denominator = per_seq - wl.mean_context * wl.kv_bytes_per_token
    return wl.weight_bytes / denominator if denominator > 0 else math.inf


def decode_tokens_per_s(hw: Hardware, wl: Workload, batch: int) -> float:
    """One engine's decode throughput at ``batch`` sequences: batch / decode_step_s(batch)."""
    return batch / decode_step_s(hw, wl, batch)


def generate_s(hw: Hardware, wl: Workload, groups: int) -> float:
    """One generate call of ``groups`` groups alone on one engine: prefill + waves · R · step(min(n, cap))."""
    n = groups * wl.group_size
    waves = math.ceil(n / wl.max_num_seqs)
    return (
        wl.gen_call_s
        + prefill_s(hw, wl, groups)
        + waves * wl.response_len * decode_step_s(hw, wl, min(n, wl.max_num_seqs))
    )


def train_s(cluster: Cluster, wl: Workload) -> float:
    """(6 + 2 · extra_forwards) · P · T / (F · mfu · trainer_devices) + train_fixed_s."""
    hw = cluster.hardware
    flops = (6 + 2 * wl.extra_forwards) * wl.params * wl.train_tokens
    return flops / (hw.peak_flops * hw.mfu * cluster.trainer_devices) + wl.train_fixed_s


def sync_s(cluster: Cluster, wl: Workload) -> float:
    """W / link + latency: rank 0 ships the full weights once (engines receive them in parallel)."""
    return wl.weight_bytes / cluster.link_bytes_per_s + cluster.sync_latency_s


def checkpoint_s(cluster: Cluster, wl: Workload) -> float:
    """checkpoint_bytes_per_param · P / checkpoint_bytes_per_s: how long a save stalls the loop."""
    return wl.checkpoint_bytes_per_param * wl.params / cluster.checkpoint_bytes_per_s


# ---- what the simulator consumes -------------------------------------------------------------------------
@dataclass(frozen=True)
class CallCost:
    """One generate call on an engine: it occupies ``seqs`` of the engine's batch; it runs ``fixed_s`` seconds
    that do not depend on the batch (prefill, per-call cost), then ``steps`` decode steps, each lasting
    ``decode_step_s(b)`` of the batch b its engine runs at that moment."""

    seqs: int
    fixed_s: float
    steps: float


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


@dataclass
class AnalyticCosts:
    """The formulas of this module for one ``Cluster`` and ``Workload``. ``train_s`` scales the step's formula
    by the groups the step took over B (a step takes >= B; more with dynamic sampling)."""

    cluster: Cluster
    workload: Workload

    @property
    def engine_seqs(self) -> int:
        return self.workload.max_num_seqs

    @property
    def overlap_slowdown(self) -> float:
        return self.cluster.overlap_slowdown

    @property
    def completions_per_group(self) -> int:
        return self.workload.group_size

    @property
    def tokens_per_completion(self) -> float:
        return float(self.workload.response_len)

    def call(self, groups: int) -> CallCost:
        wl, n = self.workload, groups * self.workload.group_size
        fixed = wl.gen_call_s + prefill_s(self.cluster.hardware, wl, groups)
        return CallCost(n, fixed, math.ceil(n / wl.max_num_seqs) * wl.response_len)

    def decode_step_s(self, batch: int) -> float:
        return decode_step_s(self.cluster.hardware, self.workload, batch)

    def score_s(self, groups: int) -> float:
        return self.workload.score_s_per_group * groups

    def train_s(self, groups: int) -> float:
        wl = self.workload
        return wl.train_fixed_s + (train_s(self.cluster, wl) - wl.train_fixed_s) * groups / wl.prompts_per_step

    def sync_s(self) -> float:
        return sync_s(self.cluster, self.workload)

    def checkpoint_s(self) -> float:
        return checkpoint_s(self.cluster, self.workload)

    def switch_s(self) -> float:
        return self.cluster.switch_s if self.cluster.placement == "colocated" else 0.0

    def restart_s(self) -> float:
        return self.cluster.restart_s


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
