"""Context parallelism: one long sequence trained on 1 rank and split over 2 (``trainer.cp_size=2``), side by side.

Per length L, ``bench.long_context``'s ``one`` case (an L-token sequence and a 1-token sibling on its prompt,
one GRPO group), one ``train_step`` on a fresh ``TrainerGroup`` of real Ray actors over gloo, ``TrainerConfig``
defaults otherwise (``auto`` checkpointing sizes L / cp tokens per rank):

    cp=1   world_size 1, the row on one rank, both cores
    cp=2   world_size 2, cp_size 2: each rank runs half the row on one core

It prints the step's seconds and the busiest rank's peak RSS (``memory/trainer_peak_gb``: that rank's
``ru_maxrss``, model load included), and their cp=2 / cp=1 ratios. Per-rank memory is what bounds the
longest sequence a GPU (or a rank's share of a host) can train: the ratio says how much longer a sequence
two ranks take than one. The host's total is about the same either way; this box has one host. Usage::

    .venv/bin/python -m bench.context_parallel [--lengths 4096 8192] [--tiny]
"""

from __future__ import annotations

import argparse
import datetime
import time

import ray

from bench.common import load_note
from bench.long_context import TEMPERATURE, Case, case_groups, model_path
from relayrl.config import AlgorithmConfig, ModelConfig, TrainerConfig
from relayrl.monitor.schema import MEMORY_TRAINER_PEAK_GB


def step(path: str, length: int, cp: int, vocab: int) -> dict:
    """One train_step of the ``one`` case at ``length`` with ``cp`` ranks; seconds and peak GB."""
    from relayrl.trainer.ranks import TrainerGroup

    groups = case_groups(Case(length, "one"), vocab)
    cfg = TrainerConfig(world_size=cp, cp_size=cp, num_cpus=1.0 / cp, num_threads=2 // cp)
    trainer = TrainerGroup(
        cp,
        path,
        ModelConfig(path=path, max_model_len=length),
        cfg,
        AlgorithmConfig(group_size=2),
        temperature=TEMPERATURE,
        timeout_s=3600.0,
    )
    try:
        trainer.ready()
        t0 = time.perf_counter()
        stats = trainer.train_step([ray.put(groups)])
        return {"s": time.perf_counter() - t0, "gb": stats[MEMORY_TRAINER_PEAK_GB], "tokens": stats["tokens"]}
    finally:
        trainer.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--tiny", action="store_true", help="the tiny Llama instead of SmolLM2-135M (smoke tests)")
    args = ap.parse_args()
    from transformers import AutoConfig

    path = model_path(args.tiny)
    vocab = AutoConfig.from_pretrained(path).vocab_size
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"{datetime.datetime.now():%Y-%m-%d %H:%M}  model {path}  {load_note()}")
    print("| L | cp=1 s | cp=1 peak GB | cp=2 s | cp=2 peak GB per rank | time cp2/cp1 | memory cp2/cp1 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for length in args.lengths:
        one, two = step(path, length, 1, vocab), step(path, length, 2, vocab)
        print(
            f"| {length} | {one['s']:.1f} | {one['gb']:.2f} | {two['s']:.1f} | {two['gb']:.2f} | "
            f"{two['s'] / one['s']:.2f} | {two['gb'] / one['gb']:.2f} |",
            flush=True,
        )
    print(f"after: {load_note()}")
    ray.shutdown()


if __name__ == "__main__":
    main()
