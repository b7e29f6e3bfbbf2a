"""The physical floor of a finished run's step on this box, next to what the run measured.

Given a run directory (``metrics.jsonl``, ``config.yaml``, ``samples.jsonl``), it measures this box's peak
GEMM rate (``torch.mm`` of 2048 x 2048 on every core, best of 5, in the run's ``trainer.dtype``) and copy
rate (a 256 MiB ``copy_``, best of 5) and, on a CPU host, the time vLLM's CPU engine needs to pack the model's
GEMM weights once (``pack_floor_s``, best of 3), reads the model's parameter count from its config (meta
device: no weights loaded) and prints, per phase, a floor computed from stated formulas and the run's median over its
steady steps (steps 2..N), with the gap measured / floor:

    update    6 * (P - P_emb) * T_computed + 6 * P_emb * T_completion  FLOPs / peak
              (forward 2 and backward 4 FLOPs per weight and token; the tied LM head only where a token
              is scored; T_computed = each group's prompt once + every completion: the trainer's default
              shared-prefix packing; attention and the optimizer left out: lower bound)
    generate  max(decode steps * weight bytes / copy rate, 2 * P * T_completion / peak)
              + 2 * P * T_prompt_once / peak
              (decode is bound by reading every weight once per step for the whole batch; decode steps =
              rollout.max_tokens if any completion was truncated, else the mean length: a lower bound)
    sync      weight bytes / copy rate + pack   (one copy of the weights, then the engine's one pass that
              packs every GEMM weight into oneDNN's blocked layout: vLLM's CPU linear reads only that copy,
              so no sync into a CPU engine can skip it. Measured: ``pack_floor_s`` over the model's own
              weight shapes, as vLLM fuses them.)

and the start-up the run measured (``startup/*``) beside its first step. Prompt tokens per group come from
the run's sample rows (the prompt text the engines saw), tokenized with the model's tokenizer.

    .venv/bin/python -m bench.floor runs/<id>
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.common import best_of, timings

if TYPE_CHECKING:  # torch is imported inside the functions that measure the box
    import torch

PHASES = {"update": "timing/update", "generate": "timing/generate", "sync": "timing/sync", "step": "timing/step"}


@dataclass(frozen=True)
class Box:
    """This box's measured rates."""

    flops: float  # peak GEMM FLOP/s on every core, in the trainer's dtype
    copy_bps: float  # bytes copied per second (a large tensor's copy_)
    pack_s: float = 0.0  # seconds to pack the model's GEMM weights once into vLLM CPU's oneDNN layout


@dataclass(frozen=True)
class Work:
    """One step's work: parameters, tokens, bytes."""

    params: int  # P
    embed_params: int  # P_emb: the (tied) embedding / LM head
    weight_bytes: int  # bytes of the weights the engines hold
    prompt_tokens: float  # each group's prompt once, summed over the step's groups
    completion_tokens: float
    decode_steps: float  # decode steps of one generate call


def update_flops(w: Work) -> float:
    """6 * (P - P_emb) * (T_prompt + T_completion) + 6 * P_emb * T_completion."""
    return (
        6 * (w.params - w.embed_params) * (w.prompt_tokens + w.completion_tokens)
        + 6 * w.embed_params * w.completion_tokens
    )


def generate_floor_s(w: Work, box: Box) -> float:
    """max(decode reads, decode FLOPs) + prefill FLOPs, in seconds."""
    decode = max(w.decode_steps * w.weight_bytes / box.copy_bps, 2 * w.params * w.completion_tokens / box.flops)
    return decode + 2 * w.params * w.prompt_tokens / box.flops


def floors(w: Work, box: Box) -> dict[str, float]:
    """Seconds per phase that no implementation on this box can beat (formulas: module docstring)."""
    out = {
        "update": update_flops(w) / box.flops,
        "generate": generate_floor_s(w, box),
        "sync": w.weight_bytes / box.copy_bps + box.pack_s,
    }
    out["step"] = sum(out.values())
    return out


def gaps(measured: dict[str, float], floor: dict[str, float]) -> dict[str, float]:
    """measured / floor per phase present in both."""
    return {k: measured[k] / floor[k] for k in floor if k in measured and floor[k] > 0}


def decode_steps(max_tokens: int, len_mean: float, truncated_frac: float) -> float:
    """A lower bound on one call's decode steps: every call runs to its longest completion."""
    return float(max_tokens) if truncated_frac > 0 else len_mean


# ---------------------------------------------------------------- measuring (not unit-tested)


def measure_box(dtype: str = "float32", weights: dict | None = None) -> Box:
    """GEMM and copy rates; with ``weights`` (name -> tensor of the engine's shapes and dtype) also the
    time to pack them (``pack_floor_s``)."""
    import torch

    torch.set_num_threads(torch.get_num_threads())
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    a, b = torch.randn(2048, 2048, dtype=dt), torch.randn(2048, 2048, dtype=dt)
    src, dst = torch.ones(64 << 20), torch.empty(64 << 20)  # 256 MiB of float32
    dst.copy_(src)
    return Box(
        flops=2 * 2048**3 / best_of(lambda: torch.mm(a, b)),
        copy_bps=src.numel() * 4 / best_of(lambda: dst.copy_(src)),
        pack_s=pack_floor_s(weights) if weights else 0.0,
    )


def gemm_weights(sd: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The weights vLLM's CPU engine packs for SmolLM2-style layers: q/k/v and gate/up fused as vLLM fuses
    them, o and down, and the LM head (the input embedding where the head is tied to it)."""
    import torch

    out = []
    for prefix in sorted({n.rsplit(".", 2)[0] for n in sd if n.endswith("_proj.weight")}):
        groups = (["q_proj", "k_proj", "v_proj"], ["gate_proj", "up_proj"], ["o_proj"], ["down_proj"])
        out += [
            torch.cat([sd[f"{prefix}.{m}.weight"] for m in group])
            for group in groups
            if all(f"{prefix}.{m}.weight" in sd for m in group)
        ]
    head = sd.get("lm_head.weight", sd.get("model.embed_tokens.weight"))
    return [*out, head]


def pack_floor_s(sd: dict[str, torch.Tensor]) -> float:
    """Seconds to build a oneDNN GEMM handle (vLLM's ``create_onednn_mm``, as its CPU linear does) for every
    weight of ``gemm_weights``, read from one warm contiguous buffer as the engine reads the payload; each
    round replaces the last round's handles, as a commit does. Best of 3 after a warm-up."""
    import torch
    from vllm import _custom_ops as ops

    weights = gemm_weights(sd)
    flat = torch.cat([w.reshape(-1) for w in weights])
    views, offset = [], 0
    for w in weights:
        views.append(flat[offset : offset + w.numel()].view(w.shape))
        offset += w.numel()
    handles = [None] * len(views)

    def pack_all() -> None:  # each round replaces the last round's handles, as a commit does
        for i, v in enumerate(views):
            handles[i] = ops.create_onednn_mm(v.t(), 32)

    return min(timings(pack_all, 3))


def meta_model(cfg: dict):
    """The run's model on the meta device: shapes and counts, no weights loaded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from relayrl.models import resolve_model

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model(cfg["model"]["path"])))


def engine_dtype(cfg: dict):
    """The engines' weight dtype (``model.dtype``)."""
    import torch

    return torch.bfloat16 if cfg["model"].get("dtype") in ("bf16", "bfloat16") else torch.float32


def run_work(run: Path, cfg: dict, rows: list[dict], model) -> Work:
    """The steady steps' work, from the run's config, metrics, sample prompts and (meta) model."""
    from relayrl.models import load_tokenizer

    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    tok = load_tokenizer(cfg["model"]["path"])
    prompts = [json.loads(x)["prompt"] for x in (run / "samples.jsonl").read_text().splitlines()]
    per_prompt = statistics.fmean(len(tok(p, add_special_tokens=False).input_ids) for p in prompts)
    steady = rows[1:] or rows
    med = lambda k: statistics.median(r[k] for r in steady)  # noqa: E731
    return Work(
        params,
        embed,
        params * engine_dtype(cfg).itemsize,
        per_prompt * cfg["run"]["prompts_per_step"],
        med("rollout/tokens"),
        decode_steps(cfg["rollout"]["max_tokens"], med("rollout/len_mean"), med("rollout/truncated_frac")),
    )


def engine_weights(model, cfg: dict) -> dict | None:
    """Uninitialised tensors of the engine's weight shapes and dtype (their values do not change a pack's
    time), or None on a GPU host, where vLLM's linears read the weights as they are."""
    import torch

    if torch.cuda.is_available():
        return None
    return {n: torch.empty(p.shape, dtype=engine_dtype(cfg)) for n, p in model.named_parameters()}


def report(run: Path) -> list[str]:
    """The lines ``main`` prints for ``run``."""
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    model = meta_model(cfg)
    work = run_work(run, cfg, rows, model)
    box = measure_box(cfg["trainer"].get("dtype", "float32"), engine_weights(model, cfg))
    floor = floors(work, box)
    steady = rows[1:] or rows
    measured = {k: statistics.median(r[m] for r in steady if m in r) for k, m in PHASES.items()}
    gap = gaps(measured, floor)
    lines = [
        (
            f"physical floor of {run.name} on this box (measured here: GEMM {box.flops / 1e9:.0f} GFLOP/s, "
            f"copy {box.copy_bps / 1e9:.1f} GB/s, oneDNN pack of the weights {box.pack_s:.3f} s; "
            f"P={work.params / 1e6:.1f}M, {work.prompt_tokens:.0f} prompt "
            f"tokens once + {work.completion_tokens:.0f} completion tokens per step, {work.decode_steps:.0f} "
            "decode steps)"
        ),
        f"{'phase':10}{'floor s':>9}{'measured s':>12}{'gap':>8}   (measured: median of steps 2..{len(rows)})",
    ]
    lines.extend(
        f"{k:10}{floor[k]:>9.3f}{measured[k]:>12.3f}{gap.get(k, float('nan')):>7.1f}x"
        for k in ("generate", "update", "sync", "step")
    )
    first = rows[0]
    start = {k.removeprefix("startup/"): v for k, v in first.items() if k.startswith("startup/")}
    lines.append(
        f"first step {first.get('timing/step', float('nan')):.2f} s (floor: the steady step's, "
        f"{floor['step']:.3f} s); start-up measured: " + ", ".join(f"{k} {v:.1f}" for k, v in start.items())
    )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a finished run directory (runs/<id>)")
    print("\n".join(report(ap.parse_args().run)))


if __name__ == "__main__":
    main()
