"""Training time and memory derived from the layout: tensor (t), pipeline (p) and data (d) parallelism, as in
Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC'21,
arXiv 2104.04473). The MFU is an output here, not an input.

A GPT of l layers, hidden h, a heads, sequence s and vocabulary V, trained on B sequences an iteration in
micro-batches of b, with full activation recomputation (the paper's setting), on devices of peak F FLOP/s::

    FLOPs an iteration     = 96 B s l h² (1 + s / (6h) + V / (16 l h))        the paper's eq. (3): 4 passes of
                                                                             the layers (forward, recompute,
                                                                             backward x2), 3 of the head
    m                      = B / (b d) micro-batches per pipeline
    layer, one micro-batch = GEMMs    96 b s h² / (t F e_gemm)               QKV, projection, MLP: 24 b s h²
                           + scores   16 b s² h / (t F e_gemm)               QK^T and x V: 4 b s² h, a pass
                           + memory   4 b s (R h + S h / t + Q a s / t) / (B_hbm e_hbm)
                                                                             element-wise kernels: R bytes a
                                                                             token replicated over the t ranks
                                                                             (layer norms, bias-dropout-add), S
                                                                             split (bias-GeLU), Q a score
                                                                             (softmax, dropout); 4 passes
                           + TP       6 · 2 (t − 1) / t · 2 b s h / (B_nvl e_nvl)
                                                                             2 all-reduces a pass, 3 passes
                                                                             (forward, recompute, backward)
    head, one micro-batch  = 6 b s h V / (t F e_gemm)                        on the last stage only
    stage, one micro-batch = (l / p) · layer + head + p2p,   p2p = 2 v · 2 b s h / t / (B_ib e_ib)
                                                                             the slowest (last) stage sets the
                                                                             pace; activations cross a stage
                                                                             boundary forward and back, once per
                                                                             virtual stage, split over the t
                                                                             ranks (scatter/gather)
    bubble                 = (p − 1) / m      GPipe, 1F1B
                             (p − 1) / (v m)  interleaved 1F1B, v virtual stages a device
                             (p − 1) / (3 v m) zero bubble (ZB-H1, Qi et al. 2024): a backward split into
                                              its input and weight halves, each as long as a forward, and
                                              the weight halves fill 2/3 of the 1F1B bubble
    iteration              = m · stage · (1 + bubble) + DP,
                             DP = 2 (d − 1) / d · G · P / (t p) / (B_ib e_ib)  the gradient all-reduce after the
                                                                             backward, G bytes a gradient
    teraFLOP/s a GPU       = FLOPs an iteration / iteration / (t p d)

Every efficiency and byte count is an assumption (``Efficiency``) except ``gemm``, which ``fit_gemm`` fits on one
measured row. ``stage_memory`` is the matching memory check: 16 bytes a parameter of the stage (mixed-precision
Adam, no ZeRO) and the activations of the micro-batches a schedule keeps in flight.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

from relayrl.config.base import choices_of
from relayrl.config.trainer import LOOPED, PipelineSchedule
from relayrl.plan.costs import Hardware

SCHEDULES = choices_of(PipelineSchedule)  # the schedules trainer.pp_schedule takes


@dataclass(frozen=True)
class GPT:
    """The paper's model family: ``layers`` l, ``hidden`` h, ``heads`` a, ``seq`` s, ``vocab`` V."""

    layers: int
    hidden: int
    heads: int
    seq: int = 2048
    vocab: int = 51200

    @property
    def params(self) -> float:
        """12 l h² (1 + 13 / (12 h) + (V + s) / (12 l h)): the paper's eq. (2)."""
        n, h = self.layers, self.hidden
        return 12 * n * h * h * (1 + 13 / (12 * h) + (self.vocab + self.seq) / (12 * n * h))

    def iteration_flops(self, batch: int) -> float:
        """96 B s l h² (1 + s / (6 h) + V / (16 l h)) with full recomputation: the paper's eq. (3)."""
        n, h, s = self.layers, self.hidden, self.seq
        return 96 * batch * s * n * h * h * (1 + s / (6 * h) + self.vocab / (16 * n * h))


@dataclass(frozen=True)
class PTDP:
    """A layout: t-way tensor, p-way pipeline (``virtual`` v stages a device under ``interleaved``) and d-way
    data parallelism, ``batch`` B sequences an iteration in micro-batches of ``micro`` b."""

    t: int
    p: int
    d: int
    batch: int
    micro: int = 1
    virtual: int = 1
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r}: {' | '.join(SCHEDULES)}")
        if self.virtual > 1 and self.schedule not in LOOPED:
            raise ValueError(f"virtual={self.virtual} needs schedule='interleaved' or 'zero_bubble'")
        if self.batch % (self.micro * self.d):
            raise ValueError(f"batch {self.batch} is not a whole number of micro-batches {self.micro} x d {self.d}")

    @property
    def gpus(self) -> int:
        return self.t * self.p * self.d

    @property
    def micro_batches(self) -> int:
        """m = B / (b d): micro-batches each pipeline runs an iteration."""
        return self.batch // (self.micro * self.d)


@dataclass(frozen=True)
class Efficiency:
    """The assumptions, each a named number. ``gemm`` is fitted (``fit_gemm``); the others are stated:
    achieved over peak bandwidth of HBM, of an NVLink all-reduce (NCCL bus bandwidth) and of InfiniBand; the
    element-wise bytes a token moves in one forward pass of a layer (fp16, fused kernels as in Megatron-LM
    2021: ``replicated`` · h for 2 layer norms and 2 bias-dropout-adds, ``split`` · h / t for the bias-GeLU of the
    4h MLP, ``score`` a attention score for softmax and dropout); ``grad_bytes`` a gradient all-reduced."""

    gemm: float = 0.7
    hbm: float = 0.8
    nvlink: float = 0.75
    ib: float = 0.8
    replicated: float = 22.0
    split: float = 16.0
    score: float = 9.0
    grad_bytes: float = 2.0


def bubble_fraction(p: int, m: int, v: int = 1, schedule: str = "1f1b") -> float:
    """Idle time over ideal compute: (p − 1) / m for GPipe and 1F1B, (p − 1) / (v m) interleaved, (p − 1) / (3 v m)
    zero bubble (module docstring)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: {' | '.join(SCHEDULES)}")
    return (p - 1) / (m * (v if schedule in LOOPED else 1) * (3 if schedule == "zero_bubble" else 1))


def ring_allreduce_s(nbytes: float, ranks: int, bytes_per_s: float) -> float:
    """2 (n − 1) / n · bytes / bandwidth: a ring all-reduce's time at its bus bandwidth; 0 for one rank."""
    return 0.0 if ranks <= 1 else 2 * (ranks - 1) / ranks * nbytes / bytes_per_s


def layer_s(hw: Hardware, gpt: GPT, lay: PTDP, eff: Efficiency) -> dict[str, float]:
    """One layer, one micro-batch, all four passes, split by what bounds it (module docstring)."""
    b, s, h, a, t = lay.micro, gpt.seq, gpt.hidden, gpt.heads, lay.t
    flops_s = hw.peak_flops * eff.gemm
    token_bytes = eff.replicated * h + eff.split * h / t + eff.score * a * s / t
    return {
        "gemm": 96 * b * s * h * h / (t * flops_s),
        "scores": 16 * b * s * s * h / (t * flops_s),
        "memory": 4 * b * s * token_bytes / (hw.hbm_bytes_per_s * eff.hbm),
        "tp": 6 * ring_allreduce_s(2 * b * s * h, t, hw.nvlink_bytes_per_s * eff.nvlink),
    }


def iteration_s(hw: Hardware, gpt: GPT, lay: PTDP, eff: Efficiency) -> dict[str, float]:
    """Seconds of one iteration (``total``) and its parts, each summed over the m micro-batches."""
    b, s, h, t, m = lay.micro, gpt.seq, gpt.hidden, lay.t, lay.micro_batches
    per_layer = layer_s(hw, gpt, lay, eff)
    stage_layers = gpt.layers / lay.p
    head = 6 * b * s * h * gpt.vocab / (t * hw.peak_flops * eff.gemm)
    p2p = 0.0 if lay.p == 1 else 2 * lay.virtual * 2 * b * s * h / t / (hw.ib_bytes_per_s * eff.ib)
    parts = {k: m * stage_layers * v for k, v in per_layer.items()}
    parts |= {"head": m * head, "p2p": m * p2p}
    busy = sum(parts.values())
    parts["bubble"] = busy * bubble_fraction(lay.p, m, lay.virtual, lay.schedule)
    grads = eff.grad_bytes * gpt.params / (t * lay.p)
    parts["dp"] = ring_allreduce_s(grads, lay.d, hw.ib_bytes_per_s * eff.ib)
    parts["total"] = sum(parts.values())
    return parts


def tflops_per_gpu(hw: Hardware, gpt: GPT, lay: PTDP, eff: Efficiency) -> float:
    """The paper's figure of merit: model FLOPs an iteration (eq. 3) over its seconds, per GPU, in 10^12."""
    return gpt.iteration_flops(lay.batch) / iteration_s(hw, gpt, lay, eff)["total"] / lay.gpus / 1e12


def fit_gemm(hw: Hardware, gpt: GPT, lay: PTDP, measured_tflops: float, eff: Efficiency = Efficiency()) -> float:
    """The GEMM efficiency at which ``lay`` reaches ``measured_tflops`` (bisection: throughput rises with it)."""
    lo, hi = 1e-3, 1.0
    if tflops_per_gpu(hw, gpt, lay, dataclasses.replace(eff, gemm=hi)) < measured_tflops:
        raise ValueError(f"{measured_tflops} TFLOP/s is out of reach even at 100 % GEMM efficiency")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (
            (mid, hi)
            if tflops_per_gpu(hw, gpt, lay, dataclasses.replace(eff, gemm=mid)) < measured_tflops
            else (lo, mid)
        )
    return (lo + hi) / 2


TRAIN_STATE_BYTES = 16.0
"""A parameter's training state without ZeRO: fp16 weights (2) and gradients (2), fp32 master weights (4) and
Adam's two moments (8), on each of the d replicas."""

LAYER_ACTIVATION = (10.0, 24.0, 5.0)
"""Korthikanti et al. 2022 (tensor parallel, no sequence parallelism): a layer keeps s b h (10 + 24 / t +
5 a s / (h t)) bytes for its backward; with full recomputation only its 2 s b h byte input."""


def in_flight(lay: PTDP) -> float:
    """Micro-batches whose activations the first stage holds at once, in units of a whole stage's layers:
    GPipe m; 1F1B min(p, m); interleaved (2 (p − 1) + (v − 1) p + 1) / v chunks of l / (p v) layers each
    (Megatron-LM's warm-up of the first stage, plus the one in flight); zero bubble as 1F1B or interleaved with
    the same v (ZB-H1 keeps 1F1B's peak: a deferred weight half holds no more than its forward left)."""
    p, m, v = lay.p, lay.micro_batches, lay.virtual
    if lay.schedule == "gpipe":
        return float(m)
    if lay.schedule == "1f1b" or v == 1:
        return float(min(p, m))
    return min(m * v, 2 * (p - 1) + (v - 1) * p + 1) / v


def stage_memory(gpt: GPT, lay: PTDP, recompute: bool = True, scores: bool = True) -> dict[str, float]:
    """Bytes on one device of the first stage: training state of its l / p layers' share, and activations of the
    micro-batches in flight (``in_flight``), recomputed (inputs only, plus one layer's full set) or kept.
    ``scores=False``: no [s, s] attention scores kept (FlashAttention), the 5 a s / (h t) term dropped."""
    b, s, h, a, t = lay.micro, gpt.seq, gpt.hidden, gpt.heads, lay.t
    c_fixed, c_split, c_score = LAYER_ACTIVATION
    c_score = c_score if scores else 0.0
    full_layer = s * b * h * (c_fixed + c_split / t + c_score * a * s / (h * t))
    layers = gpt.layers / lay.p
    if recompute:
        activations = in_flight(lay) * layers * 2 * s * b * h + full_layer
    else:
        activations = in_flight(lay) * layers * full_layer
    state = TRAIN_STATE_BYTES * gpt.params / (t * lay.p)
    return {"state": state, "activations": activations, "total": state + activations}


def layouts(
    gpt: GPT,
    gpus: int,
    batch: int,
    gpus_per_node: int = 8,
    micro: tuple[int, ...] = (1, 2, 4, 8),
    pad: bool = False,
) -> Iterator[PTDP]:
    """Every layout of ``gpus`` for this model and batch: t within a node and dividing the heads, p dividing the
    layers (p · v under interleaving, v in 2 and 4), b dividing B / d; when p > 1 1F1B, interleaved and zero bubble
    (v in 1, 2 and 4). ``pad``: any d and b,
    the batch rounded up to whole micro-batches, ceil(B / (b d)) · b d (a trainer whose last micro-batch is
    short pays for a full one)."""
    for t in _divisors(gpus_per_node):
        if gpus % t or gpt.heads % t:
            continue
        for p in _divisors(gpus // t):
            d = gpus // (t * p)
            if gpt.layers % p or (batch % d and not pad):
                continue
            for b in micro:
                if (batch // d) % b and not pad:
                    continue
                padded = -(-batch // (b * d)) * b * d
                if p == 1:
                    yield PTDP(t, 1, d, padded, b)
                    continue
                yield PTDP(t, p, d, padded, b)
                yield PTDP(t, p, d, padded, b, 1, "zero_bubble")
                for v in (2, 4):
                    if gpt.layers % (p * v) == 0:
                        yield PTDP(t, p, d, padded, b, v, "interleaved")
                        yield PTDP(t, p, d, padded, b, v, "zero_bubble")


def rank(
    hw: Hardware, gpt: GPT, gpus: int, batch: int, eff: Efficiency, top: int = 10
) -> list[tuple[PTDP, float, float]]:
    """The fastest layouts that fit the device's memory: (layout, teraFLOP/s a GPU, GiB a device), best first."""
    out = []
    for lay in layouts(gpt, gpus, batch):
        need = stage_memory(gpt, lay)["total"]
        if need <= hw.memory_bytes:
            out.append((lay, tflops_per_gpu(hw, gpt, lay, eff), need / 2**30))
    out.sort(key=lambda row: -row[1])
    return out[:top]


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def bubble_gain(p: int, m: int, v: int) -> float:
    """Throughput of interleaved 1F1B (v virtual stages) over 1F1B when the bubble is the only difference:
    (1 + (p − 1) / m) / (1 + (p − 1) / (v m))."""
    return (1 + bubble_fraction(p, m)) / (1 + bubble_fraction(p, m, v, "interleaved")) if m else math.nan
