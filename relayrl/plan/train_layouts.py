"""``relayrl simulate --train-layouts``: the trainer's (t, p, d, v, b) layouts of a cluster file's trainer GPUs
for its model and a recipe's step, ranked by ``relayrl.plan.ptdp`` with its memory check.

A step trains B · G sequences of prompt_len + rollout.max_tokens tokens (the longest a completion may make).
The model is read as the GPT of ``ptdp``: layers, hidden size and vocabulary from the cluster file's model,
heads = hidden / head_dim. A gated MLP's extra GEMM is not counted, so a Llama's FLOPs are a few percent
under. Efficiencies are ``Efficiency``'s defaults, whose GEMM efficiency is the one fitted on Megatron-LM's
A100 row (0.709, rounded to 0.7)."""

from __future__ import annotations

from relayrl.config import Config
from relayrl.plan.ptdp import GPT, Efficiency, iteration_s, rank
from relayrl.plan.specs import ClusterSpec

DEFAULT_VOCAB = 51200  # a cluster model that gives no vocabulary


def train_gpt(cfg: Config, spec: ClusterSpec, prompt_len: int) -> GPT:
    m = spec.model
    seq = prompt_len + cfg.rollout.max_tokens
    return GPT(m.layers, m.hidden, max(1, m.hidden // m.head_dim), seq, m.vocab or DEFAULT_VOCAB)


def train_layout_lines(cfg: Config, spec: ClusterSpec, prompt_len: int, top: int = 10) -> list[str]:
    """The ranked table, or one line saying that no layout fits and what to change."""
    gpt = train_gpt(cfg, spec, prompt_len)
    gpus, hw = spec.cluster.trainer_devices, spec.cluster.hardware
    batch = cfg.run.prompts_per_step * cfg.algorithm.group_size
    eff = Efficiency()
    ranked = rank(hw, gpt, gpus, batch, eff, top)
    head = (
        f"{spec.model_name} on {gpus} {hw.name} trainer GPUs: {batch} sequences of {gpt.seq} tokens a step, "
        f"GEMM efficiency {eff.gemm} (docs/simulate.md#training-time-from-the-layout-ptd-p)"
    )
    if not ranked:
        return [
            head,
            (
                "no layout fits in memory: add trainer GPUs (cluster file trainer_gpus), or shorten "
                "rollout.max_tokens or run.prompts_per_step"
            ),
        ]
    columns = f"{'t':>3} {'p':>3} {'d':>4} {'v':>2} {'b':>2} {'schedule':<11} {'TFLOP/s':>8} {'MFU':>5}"
    out = [head, f"{columns} {'step s':>8} {'GiB':>6}"]
    for lay, tflops, gib in ranked:
        seconds = iteration_s(hw, gpt, lay, eff)["total"]
        out.append(
            f"{lay.t:>3} {lay.p:>3} {lay.d:>4} {lay.virtual:>2} {lay.micro:>2} {lay.schedule:<11} {tflops:>8.1f} "
            f"{tflops * 1e12 / hw.peak_flops:>5.0%} {seconds:>8.2f} {gib:>6.1f}"
        )
    return out
