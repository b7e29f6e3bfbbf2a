"""An RL step's training time from the trainer's layout (``relayrl.plan.ptdp``), so the MFU is an output.

A step trains B · G sequences, each its prompt and its completion: ``seq = prompt_len + mean_response``
tokens for the time (``mean_response`` the capped mean of the drawn lengths), ``prompt_len + longest_response``
for the memory check. ptdp's iteration of that batch (``iteration_s``) runs the layers four times (forward,
recomputation, backward as two) and the head three times. An RL step differs in its passes::

    forward   = (gemm + scores + memory) / 4 + tp / 3 + head / 3 + p2p / 2   one forward pass of the batch
                                                                          (the layers' 4 passes, TP's 3, the
                                                                          head's 3, p2p forward and back)
    recompute = (gemm + scores + memory) / 4 + tp / 3                     the layers' recomputation
    gemm      = ptdp's GEMMs · (P − V h (1 tied, 2 untied)) / (12 l h²)    the model's own layer parameters
                                                                          (a gated MLP, grouped KV heads), not
                                                                          the GPT's 12 h² a layer
    busy      = iteration − bubble − dp                                   ptdp's passes, summed over micro-batches
    busy'     = busy + extra_forwards · forward − (recompute, when the trainer does not checkpoint)
    train_s   = busy' · (1 + bubble / busy) + dp · P / P_gpt              the schedule's bubble fraction kept;
                                                                          the model's gradients all-reduced
    MFU       = (6 + 2 · extra_forwards) · P · T / (F · GPUs · train_s)   the assumed-MFU formula
                                                                          (``costs.train_s``) solved for its MFU

``extra_forwards`` are the RL step's forward-only passes (old and reference log-probabilities), as in
``costs.train_s``; recomputation is not one of them here (``Workload.activation_checkpointing`` says whether
the trainer pays it).

The layout: the recipe's ``trainer.tp_size`` / ``pp_size`` (with ``pp_virtual_stages`` and ``pp_schedule``) when
either is above 1, micro-batch 1, d = trainer GPUs / (t p); otherwise the fastest of ``ptdp.layouts`` (the batch
padded to whole micro-batches) whose first stage fits the device (``stage_memory`` at the longest sequence,
recomputing as the trainer does, without the [s, s] scores FlashAttention never keeps). ``stage_memory`` keeps
the whole training state on each of the d replicas (Megatron without ZeRO), which is stricter than FSDP2 needs.
A named layout is used even when it does not fit; the simulator's report says so.

Efficiencies are ptdp's ``Efficiency`` (its GEMM efficiency fitted on Megatron-LM's A100 row) with ``score`` = 0:
the RL trainers modelled here run FlashAttention, whose softmax never writes the [s, s] scores to HBM (their
FLOPs stay). The model is read as ptdp's GPT (heads = hidden / head_dim) whose layers' GEMMs are scaled to the
model's parameter count, as is the memory check's training state (16 bytes a parameter of P / (t p)).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from relayrl.plan.costs import Hardware, Workload
from relayrl.plan.ptdp import GPT, PTDP, TRAIN_STATE_BYTES, Efficiency, iteration_s, layouts, stage_memory

RL_EFFICIENCY = Efficiency(score=0.0)
"""ptdp's assumptions with FlashAttention's softmax (no score bytes through HBM)."""

DEFAULT_VOCAB = 51200
"""The LM head's rows when the model gives none (the Megatron-LM paper's V)."""


@dataclass(frozen=True)
class LayoutTraining:
    """The trainer's layout for one step's work: ``gpt`` at the mean sequence, ``longest`` its longest."""

    gpt: GPT
    layout: PTDP
    longest: int
    named: bool  # from the recipe's trainer.tp_size / pp_size, else the fastest that fits
    eff: Efficiency = RL_EFFICIENCY

    def seconds(self, hw: Hardware, wl: Workload) -> float:
        return _seconds(hw, self.gpt, self.layout, wl, self.eff)

    def mfu(self, hw: Hardware, wl: Workload) -> float:
        """What ``costs.train_s`` would have to assume to give this layout's time."""
        flops = (6 + 2 * wl.extra_forwards) * wl.params * wl.train_tokens
        return flops / (hw.peak_flops * self.layout.gpus * self.seconds(hw, wl))

    def describe(self, hw: Hardware, wl: Workload) -> str:
        lay = self.layout
        how = "named by trainer.tp_size/pp_size" if self.named else "the fastest that fits"
        return (
            f"train: layout t {lay.t} p {lay.p} d {lay.d} v {lay.virtual} b {lay.micro} {lay.schedule} ({how}), "
            f"{lay.batch} sequences of {self.gpt.seq} tokens: {self.seconds(hw, wl):.2f} s, MFU {self.mfu(hw, wl):.0%} "
            "derived (docs/simulate.md#training-time-from-the-layout-ptd-p)"
        )


def pass_seconds(parts: dict[str, float]) -> tuple[float, float]:
    """(one forward pass, the layers' recomputation) of an ``iteration_s`` result (module docstring)."""
    layers = (parts["gemm"] + parts["scores"] + parts["memory"]) / 4 + parts["tp"] / 3
    return layers + parts["head"] / 3 + parts["p2p"] / 2, layers


def train_seconds(
    hw: Hardware,
    gpt: GPT,
    lay: PTDP,
    eff: Efficiency,
    extra_forwards: int,
    checkpointing: bool = True,
    layer_scale: float = 1.0,
    params: float | None = None,
) -> float:
    """One RL step's training on ``lay``: ptdp's iteration, its GEMMs times ``layer_scale`` (``layer_scale``) and
    its gradient all-reduce scaled to ``params``, with ``extra_forwards`` forward passes added and the
    recomputation taken out when the trainer does not checkpoint (module docstring)."""
    parts = iteration_s(hw, gpt, lay, eff)
    bubble = parts["bubble"] / (parts["total"] - parts["bubble"] - parts["dp"])  # of the busy time
    parts["gemm"] *= layer_scale
    forward, recompute = pass_seconds(parts)
    busy = sum(v for k, v in parts.items() if k not in ("bubble", "dp", "total"))
    rl_busy = busy + extra_forwards * forward - (0.0 if checkpointing else recompute)
    return rl_busy * (1 + bubble) + parts["dp"] * (params or gpt.params) / gpt.params


def layer_scale(wl: Workload, gpt: GPT) -> float:
    """The model's layer parameters over the GPT's 12 l h² (a gated MLP's third matrix, grouped KV heads): P less
    the head and, untied, the input embedding (V h each); 1 when the vocabulary is not given."""
    if wl.vocab <= 0:
        return 1.0
    embeddings = (1 if wl.tied_embeddings else 2) * wl.vocab * wl.hidden
    return max(wl.params - embeddings, 0.0) / (12 * gpt.layers * gpt.hidden**2) or 1.0


def _seconds(hw: Hardware, gpt: GPT, lay: PTDP, wl: Workload, eff: Efficiency = RL_EFFICIENCY) -> float:
    scale = layer_scale(wl, gpt)
    return train_seconds(hw, gpt, lay, eff, wl.extra_forwards, wl.activation_checkpointing, scale, wl.params)


def step_gpt(wl: Workload, seq: float) -> GPT | None:
    """The step's model as ptdp's GPT, or None when the workload lacks its shape (layers, hidden, heads)."""
    if wl.layers <= 0 or wl.hidden <= 0 or wl.heads <= 0:
        return None
    return GPT(wl.layers, wl.hidden, wl.heads, max(1, round(seq)), wl.vocab or DEFAULT_VOCAB)


def layout_training(
    hw: Hardware,
    wl: Workload,
    gpus: int,
    gpus_per_node: int = 8,
    named: PTDP | None = None,
) -> tuple[LayoutTraining | None, str]:
    """The trainer's layout for ``wl`` on ``gpus`` devices, or None and why (then ``costs.train_s``'s assumed MFU
    prices the step). ``named``: t, p, v and the schedule to use (its d and batch are set here)."""
    gpt = step_gpt(wl, wl.prompt_len + wl.mean_response)
    if gpt is None:
        return None, "the model's layers, hidden size or heads are not given"
    longest = wl.prompt_len + wl.longest_response
    tall = dataclasses.replace(gpt, seq=longest)
    batch = wl.prompts_per_step * wl.group_size

    def fits(lay: PTDP) -> bool:
        state = TRAIN_STATE_BYTES * wl.params / (lay.t * lay.p)  # the model's parameters, not the GPT's
        return state + stage_memory(tall, lay, wl.activation_checkpointing, False)["activations"] <= hw.memory_bytes

    if named is not None:
        if gpus % (named.t * named.p):
            return None, f"trainer.tp_size x pp_size = {named.t * named.p} does not divide {gpus} trainer GPUs"
        d = gpus // (named.t * named.p)
        lay = dataclasses.replace(named, d=d, batch=-(-batch // d) * d, micro=1)
        return LayoutTraining(gpt, lay, longest, True), "" if fits(lay) else "the named layout does not fit"
    fitting = [lay for lay in layouts(gpt, gpus, batch, gpus_per_node, pad=True) if fits(lay)]
    if not fitting:
        return None, f"no t/p/d layout of {gpus} trainer GPUs fits a device"
    best = min(fitting, key=lambda lay: _seconds(hw, gpt, lay, wl))
    return LayoutTraining(gpt, best, longest, False), ""
