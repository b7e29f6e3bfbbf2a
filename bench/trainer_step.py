"""One trainer step (forward + backward + AdamW) on a grpo_arith-shaped batch, four ways, side by side.

One process, one FSDP2 rank over gloo (world_size 1, every core), the real ``TrainerActor`` and the real
default model (SmolLM2-135M-Instruct from the relayrl cache; ``--tiny`` for the tiny Llama). The batch
has grpo_arith's shape: 4 prompts x 8 completions, prompts of ~45 tokens, completions of ~15 (8-24),
random tokens and rewards (speed and the logprob gap do not depend on what the tokens say).

    baseline        trainer.max_tokens_per_micro_batch=0 (8 padded rows per micro-batch), float32
    packed          padding-free rows of at most --budget tokens
    packed+prefix   ... with each group's prompt once (trainer.shared_prefix)
    +bf16           ... with trainer.dtype=bf16
    loop AdamW      packed+prefix with trainer.fused_adamw=false (torch's default AdamW loop; the others
                    run the default, fused)

Per variant: the median s/step (wall and process CPU) of --steps steps after one warm-up, the variants
taking turns step by step on one trainer rank (a shared box's load then hits all alike); the ratio to the baseline,
tokens the model computes per step (padded: rows x longest row; packed: the rows' real tokens) against the
step's real tokens, and max / mean |logprob - baseline logprob| over the loss tokens before any update.
Usage::

    .venv/bin/python -m bench.trainer_step [--steps 3] [--budget 2048] [--tiny] [--system-malloc]

It runs under the trainer ranks' glibc malloc settings (``relayrl.config.CPU_MALLOC_ENV``, re-executing
itself with them: glibc reads them only at start-up), so its figures are those of the product's ranks;
``--system-malloc`` keeps glibc's defaults, under which every step faults its big tensors in anew.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import torch

from relayrl.config import AlgorithmConfig, ModelConfig, TrainerConfig, malloc_env
from relayrl.trainer.actor import TrainerActor
from relayrl.trainer.batch import build_train_batch, split_batch
from relayrl.trainer.optim import policy_adamw
from relayrl.types import Trajectory, TrajectoryGroup, VersionSpan

VARIANTS = {
    "baseline (padded fp32)": {"max_tokens_per_micro_batch": 0, "shared_prefix": False},
    "packed": {"shared_prefix": False},
    "packed+prefix": {"shared_prefix": True},
    "packed+prefix+bf16": {"shared_prefix": True, "dtype": "bf16"},
    "packed+prefix, loop AdamW": {"shared_prefix": True, "fused_adamw": False},
}


def grpo_arith_groups(vocab: int, prompts: int = 4, group: int = 8, seed: int = 0) -> list[TrajectoryGroup]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for p in range(prompts):
        prompt = torch.randint(10, vocab, (int(torch.randint(42, 49, (1,), generator=g)),), generator=g).tolist()
        trajs = []
        for s in range(group):
            T = int(torch.randint(8, 25, (1,), generator=g))
            comp = torch.randint(10, vocab, (T,), generator=g).tolist()
            trajs.append(
                Trajectory(
                    p,
                    s,
                    prompt,
                    comp,
                    (-torch.rand(T, generator=g) * 3).tolist(),
                    "",
                    "stop",
                    [VersionSpan(0, 0, T)],
                    reward=float(torch.rand((), generator=g) < 0.5),
                )
            )
        out.append(TrajectoryGroup(p, f"prompt {p}", {}, trajs))
    return out


def loss_token_logprobs(actor: TrainerActor, groups: list[TrajectoryGroup]) -> tuple[torch.Tensor, int, int]:
    """Logprobs of every loss token in row order under ``actor.cfg``, tokens computed, real tokens."""
    share = split_batch(build_train_batch(groups, actor.pad_token_id), 0, 1)
    values, computed = [], 0
    for mb in actor._micro_batches(share):
        lp = actor.policy_step.logprobs(actor.model, mb)
        values += [lp[r][mb.loss_mask[r].bool()] for r in range(len(mb))]
        computed += mb.packed.n_tokens if mb.packed is not None else mb.input_ids.numel()
    return torch.cat(values), computed, int(share.attention_mask.sum())


def run(model_path: str, groups: list[TrajectoryGroup], names: list[str], budget: int, steps: int) -> dict:
    """One FSDP rank; the variants take turns step by step (round robin), so a change in the box's load
    during the run hits every variant alike. Logprobs are compared before the first update."""
    base = TrainerConfig(max_tokens_per_micro_batch=budget, micro_batch_size=8)
    cfgs = {n: dataclasses.replace(base, **VARIANTS[n]) for n in names}
    actor = TrainerActor(
        0,
        1,
        "127.0.0.1",
        0,
        model_path,
        ModelConfig(path=model_path),
        base,
        AlgorithmConfig(group_size=8),
        temperature=1.0,
        seed=0,
    )
    actor.setup()
    optimizers = {n: optimizer_for(actor, cfgs[n]) for n in names}
    out = {n: {"wall": [], "cpu": []} for n in names}
    try:
        for n in names:
            actor.cfg = cfgs[n]
            out[n]["logprobs"], out[n]["computed"], out[n]["real"] = loss_token_logprobs(actor, groups)
        for _ in range(steps + 1):
            for n in names:
                actor.cfg, actor.optimizer = cfgs[n], optimizers[n]
                t0, c0 = time.perf_counter(), time.process_time()
                actor.train_step([groups])
                out[n]["wall"].append(time.perf_counter() - t0)
                out[n]["cpu"].append(time.process_time() - c0)
    finally:
        actor.close()
    for r in out.values():
        r["s_step"], r["cpu_step"] = statistics.median(r["wall"][1:]), statistics.median(r["cpu"][1:])
    return out


def optimizer_for(actor: TrainerActor, cfg: TrainerConfig) -> torch.optim.Optimizer:
    """The actor's own AdamW, or one built the other way (``trainer.fused_adamw``) over the same parameters;
    each variant keeps its own moments, so every step is a real AdamW step."""
    if cfg.fused_adamw == actor.cfg.fused_adamw:
        return actor.optimizer
    return policy_adamw(actor.model, actor.device, cfg)


def as_trainer_ranks_allocate() -> None:
    """Re-execute this process under the trainer ranks' malloc settings unless it already runs under them."""
    env = malloc_env()
    if any(os.environ.get(k) != v for k, v in env.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per variant (after one warm-up)")
    ap.add_argument("--budget", type=int, default=2048, help="trainer.max_tokens_per_micro_batch of packed runs")
    ap.add_argument("--tiny", action="store_true", help="the tiny Llama instead of SmolLM2-135M")
    ap.add_argument("--only", nargs="*", default=None, help="variant names to run (baseline always runs)")
    ap.add_argument("--system-malloc", action="store_true", help="glibc's default malloc, not the ranks' settings")
    args = ap.parse_args()
    if not args.system_malloc:
        as_trainer_ranks_allocate()
    from transformers import AutoConfig

    from relayrl.models import resolve_model

    path = str(resolve_model("tiny-llama" if args.tiny else "smollm2"))
    groups = grpo_arith_groups(AutoConfig.from_pretrained(path).vocab_size)
    names = [n for n in VARIANTS if args.only is None or n.startswith("baseline") or n in args.only]
    results = run(path, groups, names, args.budget, args.steps)
    base = results[names[0]]
    print(
        f"model {path}  threads {torch.get_num_threads()}  steps {args.steps} (+1 warm-up, round robin)  "
        f"budget {args.budget}  malloc {'glibc defaults' if args.system_malloc else 'CPU_MALLOC_ENV'}"
    )
    print(
        f"{'variant':<24}{'s/step':>8}{'vs base':>9}{'cpu s':>8}{'vs base':>9}{'tokens computed':>17}"
        f"{'real':>6}{'max|dlogp|':>12}{'mean|dlogp|':>13}"
    )
    for n in names:
        r = results[n]
        d = (r["logprobs"] - base["logprobs"]).abs()
        print(
            f"{n:<24}{r['s_step']:>8.2f}{base['s_step'] / r['s_step']:>8.2f}x{r['cpu_step']:>8.2f}"
            f"{base['cpu_step'] / r['cpu_step']:>8.2f}x{r['computed']:>17d}{r['real']:>6d}"
            f"{float(d.max()):>12.2e}{float(d.mean()):>13.2e}"
        )
    print("per-step wall s:", {n: [round(x, 2) for x in r["wall"]] for n, r in results.items()})


if __name__ == "__main__":
    main()
