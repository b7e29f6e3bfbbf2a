"""Pipeline parallelism on this box: one GRPO step of SmolLM2-135M with the policy on 1 rank and in 2 pipeline
stages (``trainer.pp_size=2``) under each schedule, side by side, against the floor and the PTD-P model.

The step: ``groups`` groups of ``group_size`` padded rows of ``length`` tokens (a 32-token prompt each), one
micro-batch a row (``trainer.micro_batch_size=1``: m = rows micro-batches). Each case is a fresh
``TrainerGroup`` of real Ray actors over gloo; one warm-up step, then the median of ``--steps`` timed steps:

    pp=1, 2 threads    world_size 1: the row on one rank, both cores (relayrl's default on this box)
    pp=1, 1 thread     world_size 1 on one core: the work of the whole step, serially
    pp=2 <schedule>    world_size 2, pp_size 2, one core a rank: gpipe, 1f1b, interleaved (v = 3: 6 stages of 5
                       layers), zero bubble (v = 1 and 3)

The floor of a 2-stage step is half the one-thread step (each core runs half the layers) times the bubble the
schedule leaves, 1 + (p - 1) / (v m), a third of that under zero bubble
(``relayrl.plan.ptdp.bubble_fraction``). Between the two, the gap is
what the pipeline spends beyond the model: p2p sends of activations and gradients, and the per-step broadcast
of every weight from its owner (``pp_step.PipelinedPolicy.refresh``). Peak RSS is the busiest rank's: every rank
loads the whole model today, so it is not expected to halve.

``--packed`` gives the completions long-tailed lengths (one full-length row a step) and runs padded rows against
packed ones (``trainer.max_tokens_per_micro_batch`` = ``--length``, each group's prompt once), on one rank and in
2 stages under 1F1B; the packed floor is the padded step times the share of real tokens. ``--held`` prints, for each
(pp, tp, dp) layout, the policy weights the busiest rank keeps against the whole model over its ranks (no step).
Usage::

    .venv/bin/python -m bench.pipeline [--length 512] [--groups 2] [--group-size 4] [--steps 2] [--tiny] [--packed]
    .venv/bin/python -m bench.pipeline --held
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import ray
import torch

from bench.common import load_note
from bench.long_context import TEMPERATURE, model_path
from relayrl.config import AlgorithmConfig, ModelConfig, TrainerConfig
from relayrl.monitor.schema import MEMORY_TRAINER_PEAK_GB
from relayrl.plan.ptdp import bubble_fraction
from relayrl.types import Trajectory, TrajectoryGroup, VersionSpan

PROMPT = 32
CASES = [  # (label, pp, threads a rank, schedule, virtual stages)
    ("pp=1, 2 threads", 1, 2, "1f1b", 1),
    ("pp=1, 1 thread", 1, 1, "1f1b", 1),
    ("pp=2 gpipe", 2, 1, "gpipe", 1),
    ("pp=2 1f1b", 2, 1, "1f1b", 1),
    ("pp=2 interleaved v=3", 2, 1, "interleaved", 3),
    ("pp=2 zero bubble", 2, 1, "zero_bubble", 1),
    ("pp=2 zero bubble v=3", 2, 1, "zero_bubble", 3),
]


def completion_len(length: int, varied: bool, first: bool, g: torch.Generator) -> int:
    """length - PROMPT tokens; ``varied``: a long tail, (length - PROMPT) u² for u ~ U(0, 1), at least 16, the
    step's first completion full length (so the padded rows are ``length`` long either way)."""
    full = length - PROMPT
    if not varied or first:
        return full
    return max(16, int(full * float(torch.rand((), generator=g)) ** 2))


def groups_of(n_groups: int, size: int, length: int, vocab: int, varied: bool = False) -> list[TrajectoryGroup]:
    """``n_groups`` groups of ``size`` completions (``completion_len``), varied rewards."""
    g = torch.Generator().manual_seed(0)
    out = []
    for p in range(n_groups):
        prompt = torch.randint(10, vocab, (PROMPT,), generator=g).tolist()
        trajs = []
        for s in range(size):
            n = completion_len(length, varied, p == s == 0, g)
            completion = torch.randint(10, vocab, (n,), generator=g).tolist()
            logprobs = (-torch.rand(n, generator=g) * 6).tolist()
            spans = [VersionSpan(0, 0, n)]
            trajs.append(Trajectory(p, s, prompt, completion, logprobs, "", "length", spans, reward=float(s % 2)))
        out.append(TrajectoryGroup(p, f"prompt {p}", {}, trajs))
    return out


def run_case(
    path: str, pp: int, threads: int, schedule: str, virtual: int, groups: list, steps: int, budget: int = 0
) -> dict:
    """One case's median s/step and the busiest rank's peak GB; ``budget`` > 0: packed rows of at most that many
    tokens, each group's prompt once (else one padded row a micro-batch)."""
    from relayrl.trainer.ranks import TrainerGroup

    cfg = TrainerConfig(
        world_size=pp,
        pp_size=pp,
        pp_schedule=schedule,
        pp_virtual_stages=virtual,
        micro_batch_size=1,
        max_tokens_per_micro_batch=budget,
        shared_prefix=budget > 0,
        num_cpus=1.0 / pp,
        num_threads=threads,
    )
    length = max(len(t.prompt_token_ids) + len(t.completion_token_ids) for gr in groups for t in gr.trajectories)
    trainer = TrainerGroup(
        pp,
        path,
        ModelConfig(path=path, max_model_len=max(length, 1024)),
        cfg,
        AlgorithmConfig(group_size=len(groups[0].trajectories)),
        temperature=TEMPERATURE,
        timeout_s=3600.0,
    )
    try:
        trainer.ready()
        ref = ray.put(groups)
        stats = trainer.train_step([ref])  # warm-up
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            stats = trainer.train_step([ref])
            times.append(time.perf_counter() - t0)
        return {"s": statistics.median(times), "gb": stats[MEMORY_TRAINER_PEAK_GB]}
    finally:
        trainer.shutdown()


def packed_cases(path: str, groups: list, length: int, steps: int) -> None:
    """``--packed``: padded rows against packed ones, on one rank and in 2 stages (1F1B). The packed floor is the
    padded step scaled by the tokens it computes: the real tokens (each group's prompt once) over the padded."""
    trajs = [t for gr in groups for t in gr.trajectories]
    padded_tokens = len(trajs) * length
    real = sum(len(gr.trajectories[0].prompt_token_ids) for gr in groups) + sum(
        len(t.completion_token_ids) for t in trajs
    )
    print(f"real tokens {real} of {padded_tokens} padded ({real / padded_tokens:.2f}); packed budget {length}")
    print("| case | s/step | peak GB (busiest rank) | packed vs padded | floor (padded x real/padded) s | vs floor |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, pp, threads in (("pp=1, 2 threads", 1, 2), ("pp=2 1f1b", 2, 1)):
        padded = run_case(path, pp, threads, "1f1b", 1, groups, steps)
        print(f"| {label}, padded | {padded['s']:.2f} | {padded['gb']:.2f} | 1.00 | - | - |", flush=True)
        packed = run_case(path, pp, threads, "1f1b", 1, groups, steps, budget=length)
        floor = padded["s"] * real / padded_tokens
        ratio = packed["s"] / padded["s"]
        row = f"| {label}, packed | {packed['s']:.2f} | {packed['gb']:.2f} | {ratio:.2f} | {floor:.2f} |"
        print(f"{row} {packed['s'] / floor:.2f} |", flush=True)


# (pp, tp, dp): SmolLM2-135M's 30 layers split 2, 3 and 5 ways; its 9 query and 3 KV heads split 3 ways
HELD_LAYOUTS = [(1, 1, 1), (2, 1, 1), (3, 1, 1), (5, 1, 1), (2, 1, 2), (2, 3, 1), (2, 3, 2)]


def held_cases(path: str) -> None:
    """``--held``: the policy weights each rank keeps (``TrainerGroup.held_parameters``: the elements of each
    parameter it holds, fp32) for each (pp, tp, dp) layout, against the floor of the whole model over pp x tp x dp.
    Loading only, no step: what a rank keeps is set at load."""
    from relayrl.trainer.ranks import TrainerGroup

    print("| pp | tp | dp | ranks | busiest rank MB | whole model MB | floor MB (whole / ranks) | busiest / floor |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    whole = 0.0
    for pp, tp, dp in HELD_LAYOUTS:
        world = pp * tp * dp
        cfg = TrainerConfig(world_size=world, pp_size=pp, tp_size=tp, num_cpus=1.0 / world, num_threads=1)
        trainer = TrainerGroup(world, path, ModelConfig(path=path), cfg, AlgorithmConfig(), temperature=TEMPERATURE)
        try:
            trainer.ready()
            held = [4 * sum(h.values()) / 1e6 for h in trainer.held_parameters()]
        finally:
            trainer.shutdown()
        whole = whole or held[0]  # the first layout is one rank: the whole model
        floor = whole / world
        busiest = max(held)
        print(f"| {pp} | {tp} | {dp} | {world} | {busiest:.1f} | {whole:.1f} | {floor:.1f} | {busiest / floor:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="the tiny Llama (2 layers: no interleaved case)")
    ap.add_argument("--packed", action="store_true", help="long-tailed lengths: padded vs packed rows, pp=1 and 2")
    ap.add_argument("--held", action="store_true", help="the weights each rank keeps, per (pp, tp, dp) layout")
    args = ap.parse_args()
    from transformers import AutoConfig

    path = model_path(args.tiny)
    vocab = AutoConfig.from_pretrained(path).vocab_size
    groups = groups_of(args.groups, args.group_size, args.length, vocab, varied=args.packed)
    rows = args.groups * args.group_size
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"{datetime.datetime.now():%Y-%m-%d %H:%M}  model {path}  {rows} rows x {args.length} tokens  {load_note()}")
    if args.held:
        held_cases(path)
        ray.shutdown()
        return
    if args.packed:
        packed_cases(path, groups, args.length, args.steps)
        print(f"after: {load_note()}")
        ray.shutdown()
        return
    print("| case | s/step | peak GB (busiest rank) | vs pp=1 2 threads | floor s | vs floor |")
    print("| --- | --- | --- | --- | --- | --- |")
    results: dict[str, dict] = {}
    for label, pp, threads, schedule, virtual in CASES:
        if args.tiny and virtual > 1:
            continue
        out = results[label] = run_case(path, pp, threads, schedule, virtual, groups, args.steps)
        base = results[CASES[0][0]]["s"]
        floor = ""
        if pp > 1 and CASES[1][0] in results:
            f = results[CASES[1][0]]["s"] / pp * (1 + bubble_fraction(pp, rows, virtual, schedule))
            floor = f"{f:.2f} | {out['s'] / f:.2f}"
        else:
            floor = "- | -"
        print(f"| {label} | {out['s']:.2f} | {out['gb']:.2f} | {out['s'] / base:.2f} | {floor} |", flush=True)
    print(f"after: {load_note()}")
    ray.shutdown()


if __name__ == "__main__":
    main()
