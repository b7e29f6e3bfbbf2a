"""Cost models for the simulator (``relayrl.plan.simulate``): what each call of the training loop costs.

Pure functions of a ``Hardware`` (one accelerator), a ``Cluster`` (how many of them, on which side, the links)
and a ``Workload`` (the model and one step's work). Every formula is written here so it can be checked by hand;
constants that are assumed rather than measured say so. With P parameters, b sequences in an engine's batch,
``c = prompt_len + response_len / 2`` their mean context (tokens), F = ``peak_flops``, W = ``bytes_per_param`` · P::

    prefill_s(g groups)   = 2 · P · g · prompt_len / (F · gen_mfu · tp)   a group's prompt is prefilled once
                                                                           (prefix caching shares it with its G
                                                                           completions)
    engine batch          = min(max_num_seqs, kv_seqs): (0.9 · memory · tp − W) / (kv · c) sequences fit the cache
    decode_step_s(b)      = max((W + b · c · kv_bytes_per_token) / (hbm_bytes_per_s · hbm_efficiency),
                                2 · P · b / (F · gen_mfu)) / tp + tp_comm_s(b) + step_overhead_s
                                                                           a step reads every weight and each
                                                                           sequence's KV cache once (memory), or
                                                                           is bound by its FLOPs (compute)
    tp_comm_s(b)          = 2 · layers · (allreduce_latency_s + 2 (tp − 1) / tp · b · hidden · 2 / NVLink)
                                                                           0 when tp = 1 (a replica's tp devices
                                                                           all-reduce twice per layer)
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
                            T = B · (prompt_len + G · response_len)        packed rows, each group's prompt once;
                                                                           the assumed-MFU path, for a model
                                                                           without its shape: with layers,
                                                                           hidden and heads the simulator takes
                                                                           the time from the trainer's layout
                                                                           (``relayrl.plan.train_time``)
    sync_s                = W / (ways · link_bytes_per_s) + sync_latency_s link: NVLink when rollout and trainer
                                                                           devices fit in one node, else IB;
                                                                           ways = 1 (rank0), min(t, tp) (sharded)
    switch_s              = (W / tp + 16 · P / t) / host_bytes_per_s      colocated hand-over (offload + load)
    checkpoint_s          = checkpoint_bytes_per_param · P / checkpoint_bytes_per_s   (driver stall of a save)
    score_s(g groups)     = score_s_per_group · g
    memory_per_device     = rollout: (W + (prompt_len + longest response) · kv) / tp;
                            trainer: 16 · P / t + activations (checkpointed or not) + the LM head's chunk
                            of logits (``memory_per_device``)

A replica is ``rollout_tp`` devices of one node (tp above); the cluster has rollout_devices / tp replicas.

The simulator consumes these through ``relayrl.plan.cost_model`` (``AnalyticCosts``).

Not modelled yet: pipeline parallelism, a call of more sequences than an engine holds refilling its own
freed slots before its longest ends (it is costed as max(longest, sum / max_num_seqs) steps), chunked prefill
interleaved with decode (a call's prefill runs before its decode and
does not slow the other calls on its engine), the reward pool's width (every scoring call runs at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """One accelerator. Peak figures are datasheet numbers; the efficiencies are assumptions to calibrate."""

    name: str = "h100-sxm"
    peak_flops: float = 989e12  # dense BF16 FLOP/s
    hbm_bytes_per_s: float = 3.35e12
    nvlink_bytes_per_s: float = 450e9  # one direction, device to device inside a node
    ib_bytes_per_s: float = 50e9  # one 400 Gb/s NIC, between nodes
    mfu: float = 0.4  # training, when the model's shape is unknown: achieved / peak FLOP/s (assumed)
    gen_mfu: float = 0.5  # prefill and compute-bound decode (assumed)
    hbm_efficiency: float = 0.8  # decode: achieved / peak HBM bandwidth (assumed)
    step_overhead_s: float = 0.0  # per decode step: scheduling, sampling, kernel launches (assumed 0)
    memory_bytes: float = 80e9  # HBM per device
    allreduce_latency_s: float = 10e-6  # one small all-reduce inside a node (tensor parallelism; assumed)
    host_bytes_per_s: float = 25e9  # device <-> host memory (PCIe Gen4 x16, achieved): colocated offloads


H100 = Hardware()


@dataclass(frozen=True)
class Cluster:
    """Devices and links: one rollout replica per ``rollout_tp`` rollout devices (tensor parallel inside a node),
    FSDP ranks on the trainer devices. ``placement="colocated"`` time-shares the same devices (give both counts
    equal)."""

    hardware: Hardware = H100
    rollout_devices: int = 1
    trainer_devices: int = 1
    placement: str = "separate"  # separate | colocated
    gpus_per_node: int = 8
    sync_latency_s: float = 0.0  # per sync: pause, version check, commit (assumed 0)
    checkpoint_bytes_per_s: float = 2e9  # aggregate write speed of a checkpoint's shards
    switch_s: float | None = None  # colocated: one hand-over; None: ``switch_s()``'s offload formula
    restart_s: float = 0.0  # a dead replica's replacement, start to synced (the driver waits for it)
    overlap_slowdown: float = 1.0  # s: both sides this much slower while they overlap (1 on GPUs; CPU: plan.model)
    rollout_tp: int = 1  # devices per rollout replica (tensor parallel inside one node)
    sync: str = "rank0"  # rank0: trainer rank 0 sends the whole weights | sharded: every rank sends its shard

    def __post_init__(self) -> None:
        if self.placement not in ("separate", "colocated"):
            raise ValueError(f"placement={self.placement!r}: separate | colocated")
        if self.sync not in ("rank0", "sharded"):
            raise ValueError(f"sync={self.sync!r}: rank0 | sharded")
        if self.rollout_devices < 1 or self.trainer_devices < 1:
            raise ValueError("a cluster needs >= 1 rollout and >= 1 trainer device")
        tp = self.rollout_tp
        if tp < 1 or tp > self.gpus_per_node or self.rollout_devices % tp:
            raise ValueError(
                f"rollout_tp={tp}: a replica's devices sit in one node (<= gpus_per_node={self.gpus_per_node}) "
                f"and must divide rollout devices ({self.rollout_devices})"
            )

    @property
    def replicas(self) -> int:
        return self.rollout_devices // self.rollout_tp

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
    response_cv: float = 0.0  # completion lengths: lognormal, mean response_len, this coefficient of variation
    response_max: int = 0  # ... capped here (rollout.max_tokens); 0: no cap. cv 0: every completion response_len
    seed: int = 0  # the lengths' random stream (a simulation is reproducible)
    layers: int = 0  # tensor parallelism: two all-reduces per layer per decode step
    hidden: int = 0  # ... of batch x hidden activations (bf16)
    heads: int = 0  # attention heads (hidden / head_dim); with layers and hidden: the trainer's layout
    train_fixed_s: float = 0.0  # per step: batch fetch, driver <-> rank round trip
    gen_call_s: float = 0.0  # per generate call: RPC, tokenisation (added to its prefill)
    score_s_per_group: float = 0.0
    checkpoint_bytes_per_param: float = 14.0  # BF16 weights + FP32 master weights and Adam's two moments
    vocab: int = 0  # the LM head's V (0: no logits term in the memory check)
    tied_embeddings: bool = False  # the input embedding is the head's matrix (counted once in params)
    logits_chunk: int = 1024  # trainer.logits_chunk: positions the head scores at a time
    activation_checkpointing: bool = True  # every layer's input kept, one layer recomputed at a time

    @property
    def weight_bytes(self) -> float:
        return self.bytes_per_param * self.params

    @property
    def mean_response(self) -> float:
        """E[min(L, response_max)] for the lognormal L (``capped_lognormal_mean``); response_len when cv = 0."""
        return capped_lognormal_mean(self.response_len, self.response_cv, self.response_max)

    @property
    def longest_response(self) -> int:
        """The context a sequence may reach: response_max when lengths vary, else response_len."""
        return self.response_max if self.response_cv > 0 and self.response_max else self.response_len

    @property
    def train_tokens(self) -> float:
        """T = B · (prompt_len + G · mean_response): packed rows carry each group's prompt once."""
        return self.prompts_per_step * (self.prompt_len + self.group_size * self.mean_response)

    @property
    def mean_context(self) -> float:
        """c: a sequence's mean context over its decode, prompt_len + mean_response / 2."""
        return self.prompt_len + self.mean_response / 2


def lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    """(mu, sigma) of a lognormal with this mean and coefficient of variation: sigma² = ln(1 + cv²),
    mu = ln(mean) − sigma² / 2."""
    sigma = math.sqrt(math.log1p(cv * cv))
    return math.log(mean) - sigma * sigma / 2, sigma


def capped_lognormal_mean(mean: float, cv: float, cap: float) -> float:
    """E[min(L, cap)] = e^(mu + s²/2) Φ((ln cap − mu − s²) / s) + cap (1 − Φ((ln cap − mu) / s)); ``mean`` when
    cv = 0 or there is no cap (cap <= 0)."""
    if cv <= 0 or cap <= 0:
        return float(min(mean, cap) if cap > 0 else mean)
    mu, s = lognormal_params(mean, cv)
    phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    z = (math.log(cap) - mu) / s
    return math.exp(mu + s * s / 2) * phi(z - s) + cap * (1 - phi(z))


# ---- the formulas ------------------------------------------------------------------------------------------
def prefill_s(hw: Hardware, wl: Workload, groups: int, tp: int = 1) -> float:
    """2 · P · groups · prompt_len / (F · gen_mfu · tp)."""
    return 2 * wl.params * groups * wl.prompt_len / (hw.peak_flops * hw.gen_mfu * tp)


def decode_step_s(hw: Hardware, wl: Workload, batch: int, tp: int = 1) -> float:
    """One decode step of ``batch`` sequences on a replica of ``tp`` devices: max(memory, compute) / tp +
    tensor-parallel all-reduces + step overhead (module docstring)."""
    memory = (wl.weight_bytes + batch * wl.mean_context * wl.kv_bytes_per_token) / (
        hw.hbm_bytes_per_s * hw.hbm_efficiency
    )
    compute = 2 * wl.params * batch / (hw.peak_flops * hw.gen_mfu)
    return max(memory, compute) / tp + tp_comm_s(hw, wl, batch, tp) + hw.step_overhead_s


def tp_comm_s(hw: Hardware, wl: Workload, batch: int, tp: int) -> float:
    """2 · layers all-reduces a step, each latency + 2 (tp − 1) / tp · batch · hidden · 2 bytes / NVLink (ring);
    0 without tensor parallelism."""
    if tp <= 1:
        return 0.0
    ring = 2 * (tp - 1) / tp * batch * wl.hidden * 2 / hw.nvlink_bytes_per_s
    return 2 * wl.layers * (hw.allreduce_latency_s + ring)


def saturation_batch(hw: Hardware, wl: Workload) -> float:
    """The batch where a decode step turns compute bound (memory term = compute term); ``inf`` if it never does."""
    per_seq = 2 * wl.params * hw.hbm_bytes_per_s * hw.hbm_efficiency / (hw.peak_flops * hw.gen_mfu)
    denominator = per_seq - wl.mean_context * wl.kv_bytes_per_token
    return wl.weight_bytes / denominator if denominator > 0 else math.inf


def decode_tokens_per_s(hw: Hardware, wl: Workload, batch: int) -> float:
    """One engine's decode throughput at ``batch`` sequences: batch / decode_step_s(batch)."""
    return batch / decode_step_s(hw, wl, batch)


def generate_s(hw: Hardware, wl: Workload, groups: int, tp: int = 1) -> float:
    """One generate call of ``groups`` groups alone on one engine: prefill + waves · R · step(min(n, cap))."""
    n = groups * wl.group_size
    waves = math.ceil(n / wl.max_num_seqs)
    return (
        wl.gen_call_s
        + prefill_s(hw, wl, groups, tp)
        + waves * wl.response_len * decode_step_s(hw, wl, min(n, wl.max_num_seqs), tp)
    )


def train_s(cluster: Cluster, wl: Workload) -> float:
    """(6 + 2 · extra_forwards) · P · T / (F · mfu · trainer_devices) + train_fixed_s."""
    hw = cluster.hardware
    flops = (6 + 2 * wl.extra_forwards) * wl.params * wl.train_tokens
    return flops / (hw.peak_flops * hw.mfu * cluster.trainer_devices) + wl.train_fixed_s


def sync_s(cluster: Cluster, wl: Workload) -> float:
    """rank0: W / link + latency: rank 0 ships the full weights once (engines receive them in parallel).
    sharded: every trainer rank sends its W / t and every replica device receives its W / tp, pipelined
    across replicas: W / (min(t, tp) · link) + latency."""
    ways = 1 if cluster.sync == "rank0" else min(cluster.trainer_devices, cluster.rollout_tp)
    return wl.weight_bytes / (ways * cluster.link_bytes_per_s) + cluster.sync_latency_s


def switch_s(cluster: Cluster, wl: Workload) -> float:
    """A colocated hand-over (``Cluster.switch_s`` when given): one side offloads to host memory and the other
    loads back, (W / tp + 16 · P / t) / host_bytes_per_s (the engines' weights; the trainer's sharded state)."""
    if cluster.switch_s is not None:
        return cluster.switch_s
    moved = wl.weight_bytes / cluster.rollout_tp + TRAIN_BYTES_PER_PARAM * wl.params / cluster.trainer_devices
    return moved / cluster.hardware.host_bytes_per_s


def checkpoint_s(cluster: Cluster, wl: Workload) -> float:
    """checkpoint_bytes_per_param · P / checkpoint_bytes_per_s: how long a save stalls the loop."""
    return wl.checkpoint_bytes_per_param * wl.params / cluster.checkpoint_bytes_per_s


TRAIN_BYTES_PER_PARAM = 16.0
"""FSDP mixed precision per parameter, sharded: FP32 master weights (4), FP32 gradients (4), Adam's two
moments (8); the BF16 copy of the layer being computed is transient."""

LAYER_ACTIVATION_BYTES = 34
"""BF16 activations one transformer layer keeps per token and hidden unit (Korthikanti et al. 2022, with the
attention's s² terms gone: packed attention keeps no [s, s] scores)."""

LOGIT_BYTES = 12
"""Per scored position and vocabulary entry, in FP32: the logits, their softmax and their gradient."""


def activation_bytes(wl: Workload, tokens: float) -> float:
    """What one micro-batch of ``tokens`` keeps for the backward. Checkpointed: every layer's BF16 input
    (2 · layers · hidden a token) and one layer's recompute (34 · hidden); else 34 · hidden for every layer."""
    per_layer = LAYER_ACTIVATION_BYTES * wl.hidden
    if wl.activation_checkpointing:
        return tokens * (2 * wl.layers * wl.hidden + per_layer)
    return tokens * wl.layers * per_layer


def logits_bytes(wl: Workload, tokens: float) -> float:
    """The LM head's working set: 12 · V bytes for each of ``min(logits_chunk, tokens)`` positions (the head
    scores a chunk at a time, forward and backward; [tokens, V] logits never exist)."""
    return LOGIT_BYTES * wl.vocab * min(wl.logits_chunk, tokens)


def memory_per_device(cluster: Cluster, wl: Workload) -> dict[str, float]:
    """Bytes one device needs. rollout: (W + the KV cache of one longest context) / tp, the least vLLM starts
    with (more cache only admits more sequences: ``kv_seqs``). trainer: 16 · P / t (``TRAIN_BYTES_PER_PARAM``)
    + the activations (``activation_bytes``) and the head's chunk (``logits_bytes``) of a micro-batch of one
    longest context. Colocated: the larger of the two (the engines sleep, weights and cache offloaded, while
    the trainer works, and the trainer's state is offloaded while they generate)."""
    context = wl.prompt_len + wl.longest_response
    rollout = (wl.weight_bytes + context * wl.kv_bytes_per_token) / cluster.rollout_tp
    working = activation_bytes(wl, context) + logits_bytes(wl, context)
    trainer = TRAIN_BYTES_PER_PARAM * wl.params / cluster.trainer_devices + working
    out = {"rollout": rollout, "trainer": trainer}
    if cluster.placement == "colocated":
        out["colocated"] = max(rollout, trainer)
    return out


def kv_seqs(cluster: Cluster, wl: Workload, utilization: float = 0.9) -> int:
    """Sequences a replica's KV cache holds at their mean context c: (utilization · memory · tp − W) /
    (kv_bytes_per_token · c), at least 1 (vLLM pages the cache, so the mean context, not the longest, sets how
    many run at once). Unlimited when the workload gives no KV size."""
    if wl.kv_bytes_per_token <= 0:
        return 1 << 30
    budget = utilization * cluster.hardware.memory_bytes * cluster.rollout_tp - wl.weight_bytes
    return max(1, int(budget / (wl.kv_bytes_per_token * wl.mean_context)))


def memory_fits(cluster: Cluster, wl: Workload, utilization: float = 0.9) -> tuple[bool, str]:
    """(fits, why): every side within ``utilization`` of the device's memory (vLLM's
    ``gpu_memory_utilization`` default), and why not, naming the side and the GiB."""
    budget = utilization * cluster.hardware.memory_bytes
    for side, need in memory_per_device(cluster, wl).items():
        if need > budget:
            return False, f"{side} needs {need / 2**30:.0f} GiB a device > {budget / 2**30:.0f} GiB"
    return True, ""
