"""The PTD-P model (``relayrl.plan.ptdp``) against Narayanan et al. (SC'21, arXiv 2104.04473).

``WEAK_SCALING`` is the paper's Table 1: GPT models from 1.7B to 1T parameters on 32 to 3072 A100-80GB GPUs of
Selene (8 a node, NVLink inside, 8 HDR InfiniBand NICs a node), sequence 2048, vocabulary 51,200, with the
paper's t, p, GPU count and batch, and the per-GPU teraFLOP/s it measured. The 1T row matches the abstract
(502 petaFLOP/s on 3072 GPUs, 52 % of peak); the other rows are transcribed from the table, and the PDF could
not be re-read from this box. One constant is fitted: the GEMM efficiency, on the first row (t = p = 1); every
other row is a prediction.

Assumed (``ASSUMED``, also in ``Efficiency``): micro-batch 1; the non-interleaved 1F1B schedule; fp16
gradients; the bandwidth efficiencies and element-wise byte counts of ``Efficiency``.

``interleaved_gain`` is the paper's Figure 12 setting: the 175B GPT-3 model (96 layers, h 12288, 96 heads) on
96 GPUs, t = 8, p = 12, d = 1, micro-batch 1, batch 12 to 60, with v = 4: the paper's own script for the figure
(Megatron-LM's ``examples/sc21/run_figure_12.sh``) sets 2 layers a virtual stage, and 96 layers over 12 stages
leave 8 layers a rank. The paper's text gives the gain as "10+%" (abstract) and says it shrinks as the batch
grows; the figure's own points were not retrievable.
"""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.plan import zero3
from relayrl.plan.ptdp import GPT, PTDP, Efficiency, fit_gemm, iteration_s, tflops_per_gpu
from relayrl.plan.specs import GPUS

A100 = GPUS["a100-80g"]


@dataclass(frozen=True)
class ScalingRow:
    billions: float  # the paper's parameter count
    heads: int
    hidden: int
    layers: int
    t: int
    p: int
    gpus: int
    batch: int
    tflops: float  # measured teraFLOP/s a GPU

    @property
    def gpt(self) -> GPT:
        return GPT(self.layers, self.hidden, self.heads)

    @property
    def layout(self) -> PTDP:
        return PTDP(self.t, self.p, self.gpus // (self.t * self.p), self.batch)


WEAK_SCALING = (
    ScalingRow(1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    ScalingRow(3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    ScalingRow(7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    ScalingRow(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    ScalingRow(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    ScalingRow(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ScalingRow(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ScalingRow(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ScalingRow(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ScalingRow(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)

FIG12_V = 4  # run_figure_12.sh: --num-layers-per-virtual-pipeline-stage 2; 96 layers / (p 12 x 2)
ASSUMED = {"micro_batch": 1, "schedule": "1f1b", "grad_bytes": 2}
GPT3 = GPT(96, 12288, 96)


def fitted() -> Efficiency:
    """``Efficiency`` with its GEMM efficiency fitted on the first row."""
    first = WEAK_SCALING[0]
    return Efficiency(gemm=fit_gemm(A100, first.gpt, first.layout, first.tflops))


@dataclass(frozen=True)
class Predicted:
    """A row and its prediction: teraFLOP/s a GPU, the error against the paper, the iteration's parts (s)."""

    row: ScalingRow
    sim: float
    parts: dict[str, float]
    fitted: bool
    gemm: float

    @property
    def error(self) -> float:
        return abs(self.sim - self.row.tflops) / self.row.tflops


def weak_scaling() -> list[Predicted]:
    """Every row of ``WEAK_SCALING`` predicted with the GEMM efficiency fitted on the first."""
    eff = fitted()
    return [
        Predicted(
            row,
            tflops_per_gpu(A100, row.gpt, row.layout, eff),
            iteration_s(A100, row.gpt, row.layout, eff),
            i == 0,
            eff.gemm,
        )
        for i, row in enumerate(WEAK_SCALING)
    ]


def interleaved_gain(batches: tuple[int, ...] = (12, 24, 36, 48, 60), v: int = FIG12_V) -> list[dict[str, float]]:
    """Interleaved over 1F1B throughput for GPT-3 175B on 96 GPUs (t 8, p 12), at each batch (module doc)."""
    eff = fitted()
    out = []
    for batch in batches:
        plain = tflops_per_gpu(A100, GPT3, PTDP(8, 12, 1, batch), eff)
        inter = tflops_per_gpu(A100, GPT3, PTDP(8, 12, 1, batch, 1, v, "interleaved"), eff)
        out.append({"batch": batch, "1f1b": plain, "interleaved": inter, "gain": inter / plain - 1})
    return out


@dataclass(frozen=True)
class SchemeRow:
    """One row of the paper's Table 2: a ``scheme`` (``zero3``: ZeRO-3 without model parallelism; ``ptdp``: t 8,
    p = model-parallel size / 8), ``gpt``, batch, GPUs, micro-batch and measured teraFLOP/s a GPU."""

    scheme: str
    gpt: GPT
    model_parallel: int
    batch: int
    gpus: int
    micro: int
    tflops: float


GPT_530B = GPT(105, 20480, 128)
TABLE2 = (
    SchemeRow("zero3", GPT3, 1, 1536, 384, 4, 144),
    SchemeRow("zero3", GPT3, 1, 1536, 768, 2, 88),
    SchemeRow("zero3", GPT3, 1, 1536, 1536, 1, 44),
    SchemeRow("zero3", GPT_530B, 1, 2560, 640, 4, 138),
    SchemeRow("zero3", GPT_530B, 1, 2240, 1120, 2, 98),
    SchemeRow("zero3", GPT_530B, 1, 2240, 2240, 1, 48),
    SchemeRow("ptdp", GPT3, 96, 1536, 384, 1, 153),
    SchemeRow("ptdp", GPT3, 96, 1536, 768, 1, 149),
    SchemeRow("ptdp", GPT3, 96, 1536, 1536, 1, 141),
    SchemeRow("ptdp", GPT_530B, 280, 2240, 560, 1, 171),
    SchemeRow("ptdp", GPT_530B, 280, 2240, 1120, 1, 167),
    SchemeRow("ptdp", GPT_530B, 280, 2240, 2240, 1, 159),
)
"""The paper's Table 2 (section 5.2): the 174.6B and 529.6B GPTs under ZeRO-3 without model parallelism and
under PTD-P, each on three GPU counts at a fixed batch (the 530B ZeRO-3 run needed 640 GPUs and batch 2560 to
fit at micro-batch 4). Transcribed from two secondary write-ups of the table that agree (the PDF could not be read
from this box); the paper's text: PTD-P beats ZeRO-3 by about 70 % when the GPUs double at a fixed batch."""


def scheme_tflops(row: SchemeRow, eff: Efficiency) -> float:
    """The model's teraFLOP/s a GPU for a Table 2 row: ``zero3`` or PTD-P at t 8 (1F1B, micro-batch 1)."""
    if row.scheme == "zero3":
        return zero3.tflops_per_gpu(A100, row.gpt, row.gpus, row.batch, row.micro, eff)
    t, p = 8, row.model_parallel // 8
    return tflops_per_gpu(A100, row.gpt, PTDP(t, p, row.gpus // row.model_parallel, row.batch, row.micro), eff)


def zero3_comparison() -> list[dict[str, float | str]]:
    """Every Table 2 row with the model's prediction (GEMM efficiency fitted on Table 1's first row: nothing is
    fitted on Table 2)."""
    eff = fitted()
    out: list[dict[str, float | str]] = []
    for row in TABLE2:
        sim = scheme_tflops(row, eff)
        billions = round(row.gpt.params / 1e9, 1)
        layout: dict[str, float | str] = {"scheme": row.scheme, "billions": billions, "gpus": row.gpus}
        layout |= {"batch": row.batch, "micro": row.micro}
        out.append(layout | {"paper": row.tflops, "sim": sim, "error": sim / row.tflops - 1})
    return out
