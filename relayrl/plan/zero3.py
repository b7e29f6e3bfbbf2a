"""ZeRO-3 (fully sharded data parallelism, FSDP) without model parallelism, in the terms of ``ptdp``: the baseline
of Narayanan et al.'s section 5.2 and Table 2 (SC'21, arXiv 2104.04473), and the layout of relayrl's own FSDP2
trainer.

Each of the d = N ranks holds 1 / N of every parameter, gradient and optimizer state and runs its own
micro-batches: b sequences each, m = B / (b N) an iteration. A pass over the layers gathers each layer's weights
from every rank and frees them after use, so a micro-batch moves the model's weights once a pass (``gathers``:
forward, recomputation and backward with full recomputation, forward and backward without) and its gradients
once (a reduce-scatter), each a ring collective on the GPU's own NIC::

    compute, one micro-batch = l · (gemm + scores + memory of ``ptdp.layer_s`` at t = 1, 4 passes) + head
    comm, one micro-batch    = (gathers + 1) · (N − 1) / N · G · P / (B_ib e_ib)     G bytes a weight or a
                                                                                   gradient (fp16; ``grad_bytes``)
    iteration                = m · max(compute, comm)        prefetching the next layer hides the shorter of the
                                                             two entirely (an upper bound on the overlap)
    memory a device          = 16 · P / N + activations (``ptdp.stage_memory`` at p = 1) + 2 layers' gathered
                               weights (the one in use and the one prefetched)

The compute is the PTD-P model's at t = p = 1, with the same fitted GEMM efficiency: nothing is fitted here. Its
figure of merit is ``ptdp``'s: the paper's eq. (3) FLOPs over the iteration, per GPU.
"""

from __future__ import annotations

from relayrl.plan.costs import Hardware
from relayrl.plan.ptdp import GPT, PTDP, TRAIN_STATE_BYTES, Efficiency, layer_s, stage_memory


def gathers(recompute: bool = True) -> int:
    """Passes over the layers that need their weights: forward, recomputation (if any), backward."""
    return 3 if recompute else 2


def compute_s(hw: Hardware, gpt: GPT, micro: int, eff: Efficiency) -> float:
    """One micro-batch of ``micro`` sequences, all four passes, on one GPU holding the whole layer (t = 1)."""
    lay = PTDP(1, 1, 1, micro, micro)
    per_layer = layer_s(hw, gpt, lay, eff)
    head = 6 * micro * gpt.seq * gpt.hidden * gpt.vocab / (hw.peak_flops * eff.gemm)
    return gpt.layers * (per_layer["gemm"] + per_layer["scores"] + per_layer["memory"]) + head


def comm_s(hw: Hardware, gpt: GPT, ranks: int, eff: Efficiency, recompute: bool = True) -> float:
    """One micro-batch's weight gathers and gradient reduce-scatter: (gathers + 1) ring collectives of G · P bytes,
    each moving (N − 1) / N of them through every GPU's NIC; 0 on one rank."""
    if ranks <= 1:
        return 0.0
    per_collective = (ranks - 1) / ranks * eff.grad_bytes * gpt.params / (hw.ib_bytes_per_s * eff.ib)
    return (gathers(recompute) + 1) * per_collective


def iteration_s(hw: Hardware, gpt: GPT, ranks: int, batch: int, micro: int, eff: Efficiency) -> dict[str, float]:
    """Seconds of one iteration (``total``), its ``compute`` and ``comm`` a micro-batch, and ``m``."""
    if batch % (micro * ranks):
        raise ValueError(f"batch {batch} is not a whole number of micro-batches {micro} x ranks {ranks}")
    m = batch // (micro * ranks)
    compute, comm = compute_s(hw, gpt, micro, eff), comm_s(hw, gpt, ranks, eff)
    return {"compute": compute, "comm": comm, "m": float(m), "total": m * max(compute, comm)}


def tflops_per_gpu(hw: Hardware, gpt: GPT, ranks: int, batch: int, micro: int, eff: Efficiency) -> float:
    """The paper's eq. (3) FLOPs an iteration over its seconds, per GPU, in 10^12."""
    return gpt.iteration_flops(batch) / iteration_s(hw, gpt, ranks, batch, micro, eff)["total"] / ranks / 1e12


def memory(gpt: GPT, ranks: int, batch: int, micro: int, recompute: bool = True) -> dict[str, float]:
    """Bytes a device (module docstring): the sharded training state, one micro-batch's activations and two
    layers' gathered fp16 weights."""
    state = TRAIN_STATE_BYTES * gpt.params / ranks
    activations = stage_memory(gpt, PTDP(1, 1, ranks, batch, micro), recompute)["activations"]
    gathered = 2 * 2 * 12 * gpt.hidden**2
    return {"state": state, "activations": activations, "gathered": gathered, "total": state + activations + gathered}
