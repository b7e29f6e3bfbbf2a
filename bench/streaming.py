"""Long-tailed generation: sync, async with chunks and async streaming, side by side in one run.

The workload is the main job's (``grpo_arith``: generated additions, SmolLM2-135M-Instruct, 4 prompts x 8
completions a step) with ``rollout.max_tokens=300``: the untrained model stops after 4 to 300 tokens
(median ~20, mean ~47, a few at the cap), and a group's longest completion is ~2.5x its mean. A chunk's
batch then empties through its tail: every decode step costs nearly the same for 2 sequences as for 32.

Each mode is one ``relayrl train`` run of the same recipe, prompts and seeds:

    sync          mode=sync: generate the step's chunk, then train on it (every core for each phase)
    async-chunk   mode=async, buffer.max_staleness=1: one chunk per replica in flight, next step's while training
    async-stream  the same with rollout.stream=true: a group starts when slots free up, leaves when it ends
    async-stream-turns      async-stream with rollout.pause_while_training: engines pause while a step trains
                            (sequences frozen, carried over), so each side takes every core in its turn
    async-stream-turns-k2   the same with buffer.max_staleness=2 (more groups to fill the batch with)
    async-stream-all-cores  async-stream with the engine and the trainer each on every core at once (not split)

It prints per mode, over the steps after ``--warmup``: completions/s and trained tokens/s (completion
tokens the trainer trained on over wall time), engine occupancy (``rollout/occupancy``: mean running
sequences per engine step over the target), the trainer's idle fraction (``idle/trainer``, time-weighted),
mean reward per step with its standard error, and each rate's ratio to sync.

    python -m bench.streaming                               # the long-tail workload, 20 steps per mode
    python -m bench.streaming --steps 10 --modes sync async-stream
    python -m bench.streaming --max-tokens 0                # grpo_arith as shipped (its own max_tokens)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.common import load_note, run_relayrl

RECIPE = "grpo_arith"
CORES = os.cpu_count() or 1
TURNS = ["rollout.pause_while_training=true"]
DEFAULT_MODES = ["sync", "async-chunk", "async-stream", "async-stream-turns"]

MODES = {
    "sync": ["mode=sync"],
    "async-chunk": ["mode=async", "buffer.max_staleness=1"],
    "async-stream": ["mode=async", "buffer.max_staleness=1", "rollout.stream=true"],
    # the two sides take turns on every core: the engines pause (sequences frozen) while a step trains
    "async-stream-turns": ["mode=async", "buffer.max_staleness=1", "rollout.stream=true", *TURNS],
    "async-stream-turns-k2": ["mode=async", "buffer.max_staleness=2", "rollout.stream=true", *TURNS],
    # both sides on every core at once (the OS shares them out)
    "async-stream-all-cores": [
        "mode=async",
        "buffer.max_staleness=1",
        "rollout.stream=true",
        f"rollout.num_threads={CORES}",
        f"trainer.num_threads={CORES}",
    ],
}
KV_CACHE_GB = 1.0
"""Room for 32 sequences of ~360 tokens in fp32 (~0.55 GB), the same in every mode."""


@dataclass
class Figures:
    """One mode's rates over the measured steps."""

    steps: int
    step_s: float  # mean wall seconds per step
    completions_per_s: float
    tokens_per_s: float  # completion tokens trained per wall second
    occupancy: float  # engine-step-weighted mean of rollout/occupancy
    running: float  # mean sequences running per engine step
    trainer_idle: float  # time-weighted mean of idle/trainer
    reward: float  # mean reward per step
    reward_se: float  # its standard error over the steps
    len_mean: float
    wall_s: float  # launch -> exit


def figures(rows: list[dict], warmup: int, wall_s: float) -> Figures:
    """The rates of one run's ``metrics.jsonl`` rows after the first ``warmup`` steps (engine start-up and
    the first steps' compilation and page faults are not what the modes differ in)."""
    rows = rows[warmup:]
    if not rows:
        raise SystemExit(f"no steps left after --warmup {warmup}; run more --steps")
    wall = sum(r["timing/step"] for r in rows)
    engine_steps = sum(r.get("rollout/engine_steps", 0.0) for r in rows) or 1.0
    rewards = [r["reward/mean"] for r in rows]
    return Figures(
        steps=len(rows),
        step_s=wall / len(rows),
        completions_per_s=sum(r["rollout/completions"] for r in rows) / wall,
        tokens_per_s=sum(r["rollout/tokens"] for r in rows) / wall,
        occupancy=sum(r.get("rollout/occupancy", 0.0) * r.get("rollout/engine_steps", 0.0) for r in rows)
        / engine_steps,
        running=sum(r.get("rollout/running", 0.0) * r.get("rollout/engine_steps", 0.0) for r in rows) / engine_steps,
        trainer_idle=sum(r["idle/trainer"] * r["timing/step"] for r in rows) / wall,
        reward=statistics.mean(rewards),
        reward_se=statistics.stdev(rewards) / len(rewards) ** 0.5 if len(rewards) > 1 else float("nan"),
        len_mean=statistics.mean(r["rollout/len_mean"] for r in rows),
        wall_s=wall_s,
    )


def table(results: dict[str, Figures]) -> str:
    """The markdown table of every mode, with each rate's ratio to the first mode (sync)."""
    base = next(iter(results.values()))
    head = "mode | s/step | completions/s | trained tokens/s | x first | occupancy | running | trainer idle"
    lines = [
        f"| {head} | reward/step (± se) | len | wall s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, f in results.items():
        lines.append(
            f"| {name} | {f.step_s:.2f} | {f.completions_per_s:.2f} | {f.tokens_per_s:.0f} "
            f"| {f.tokens_per_s / base.tokens_per_s:.2f} | {f.occupancy:.2f} | {f.running:.1f} "
            f"| {f.trainer_idle:.2f} | {f.reward:.3f} ± {f.reward_se:.3f} | {f.len_mean:.0f} | {f.wall_s:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the rates")
    parser.add_argument("--modes", nargs="+", default=DEFAULT_MODES, choices=list(MODES))
    parser.add_argument("--max-tokens", type=int, default=300, help="0: the recipe's own")
    parser.add_argument("--work", type=Path, default=None, help="where the runs go (default: a temp dir)")
    parser.add_argument("overrides", nargs="*", help="more overrides for every mode")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="relayrl-streaming-"))
    workload = [f"rollout.max_tokens={args.max_tokens}"] if args.max_tokens else []
    workload += [f"rollout.kv_cache_gb={KV_CACHE_GB}", "eval.every=0", *args.overrides]
    print(f"{RECIPE} {' '.join(workload)}, {args.steps} steps per mode; {load_note()}; runs in {work}")
    results: dict[str, Figures] = {}
    for name in args.modes:
        side = run_relayrl(RECIPE, args.steps, [*workload, *MODES[name]], work / name)
        assert side.run_dir is not None
        rows = [json.loads(line) for line in (side.run_dir / "metrics.jsonl").read_text().splitlines()]
        results[name] = figures(rows, args.warmup, side.wall)
        print(f"{name}: done in {side.wall:.0f} s; {load_note()}", flush=True)
    print(table(results))
    (work / "streaming.json").write_text(json.dumps({k: vars(v) for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
