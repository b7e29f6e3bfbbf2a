"""What the benches share: a ``relayrl train`` run measured from outside, the learning-parity rule,
the prompts a recipe's run sees, and small timing helpers."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
"""The repository root: where ``python -m bench.<name>`` children start."""

RELAYRL = ["logging.wandb=disabled", "run.save_final=false"]
"""relayrl overrides beyond the recipe: no wandb, no final model (the baselines save none)."""

PARITY_FRACTION, PARITY_STEPS = 0.9, 1.25
"""Learning parity: the threshold is 90 % of the reference run's best 3-step mean reward; another
run is at parity when it first reaches it within 1.25x the steps the reference needed (issue 16's
rule)."""


@dataclass
class Side:
    """What one side's run measured: per-step figures and process times (seconds, from launch)."""

    step_s: list[float]  # [steps] wall seconds per step
    completions: list[float]  # [steps] completions trained on per step
    rewards: list[float]  # [steps] mean reward of the step's completions
    lengths: list[float]  # [steps] mean completion length in tokens
    first_step_at: float  # launch -> first step logged
    wall: float  # launch -> process exit
    load: tuple[float, float]  # 1-min load average before and after
    # relayrl's side only:
    mismatch: list[float] = field(default_factory=list)  # mismatch/mean_abs at each probe
    behaviour_kl: list[float] = field(default_factory=list)  # [steps] policy/behaviour_kl
    engine_s: float = float("nan")  # startup/engine_s
    run_dir: Path | None = None  # the run directory
    generate_s: list[float] = field(default_factory=list)  # [steps] generate + reward seconds
    train_s: list[float] = field(default_factory=list)  # [steps] train + sync seconds


def run_relayrl(recipe: str, steps: int, overrides: list[str], work: Path) -> Side:
    """``relayrl train`` in a subprocess (output in ``work/relayrl.log``); its figures come from the
    run's ``metrics.jsonl``, its launch and exit times from here."""
    out = work / "relayrl"
    work.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "relayrl.cli",
        "train",
        "--config-name",
        recipe,
        f"run.steps={steps}",
        f"run.output_dir={out}",
        *RELAYRL,
        *overrides,
    ]
    load0, start = os.getloadavg()[0], time.time()
    run_logged(cmd, work / "relayrl.log")
    wall = time.time() - start
    metrics_file = next(out.glob("*/metrics.jsonl"))
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    return Side(
        step_s=[r["timing/step"] for r in rows],
        completions=[r["rollout/completions"] for r in rows],
        rewards=[r["reward/mean"] for r in rows],
        lengths=[r["rollout/len_mean"] for r in rows],
        first_step_at=rows[0]["wall_time"] - start,
        wall=wall,
        load=(load0, os.getloadavg()[0]),
        mismatch=[r["mismatch/mean_abs"] for r in rows if "mismatch/mean_abs" in r],
        behaviour_kl=[r.get("policy/behaviour_kl", float("nan")) for r in rows],
        engine_s=rows[0].get("startup/engine_s", float("nan")),
        run_dir=metrics_file.parent,
        generate_s=[r["timing/generate"] + r["timing/reward"] for r in rows],
        train_s=[r["timing/train"] + r["timing/sync"] for r in rows],
    )


def run_logged(cmd: list[str], log: Path) -> None:
    """Run ``cmd`` from the repository root with its output in ``log``; on failure show the log's
    tail and stop."""
    with log.open("w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False, cwd=ROOT)
    rc = done.returncode
    if rc != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        sys.exit(f"{' '.join(cmd[:6])} ... exited {rc}; last lines of {log}:\n{tail}")


def steps_to(rewards: list[float], threshold: float, window: int = 3) -> int | None:
    """First step (1-based) at which the trailing ``window``-step mean reward reaches
    ``threshold``."""
    for i in range(window, len(rewards) + 1):
        if statistics.mean(rewards[i - window : i]) >= threshold:
            return i
    return None


def best_mean(rewards: list[float], window: int = 3) -> float:
    """The best ``window``-step mean reward of a run (the parity threshold is a fraction of it); a
    run shorter than ``window`` steps: its mean."""
    window = min(window, len(rewards))
    return max(statistics.mean(rewards[i - window : i]) for i in range(window, len(rewards) + 1))


def prompt_rows(cfg: Any, tokenizer: Any, steps: int) -> list[dict]:
    """The prompts relayrl's run of ``cfg`` sees, in order:
    ``{"prompt": chat-formatted text, **columns}``."""
    from relayrl.data import load_task
    from relayrl.data.sampler import PromptSampler, chat_formatter

    sampler = PromptSampler(
        load_task(cfg.data),
        cfg.run.prompts_per_step,
        cfg.data.seed,
        chat_formatter(tokenizer, cfg.data.chat_template),
        sampling_seed=cfg.run.seed,
    )
    batches = [sampler.next_batch() for _ in range(steps)]
    return [{**p.columns, "prompt": p.prompt} for batch in batches for p in batch]


def timings(fn: Callable[[], Any], n: int, warmup: int = 1) -> list[float]:
    """Seconds of each of ``n`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def best_of(fn: Callable[[], Any], n: int = 5) -> float:
    """The fastest of ``n`` calls (after one untimed): the rate with the least interference."""
    return min(timings(fn, n))


def load_note() -> str:
    """The box's 1-min load average and cores, printed beside figures (a shared box skews times)."""
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
