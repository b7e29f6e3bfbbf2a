"""Checking the planner against real runs: run a recipe in a layout, read its median step.

Used by ``bench/plan_accuracy.py`` and the planner's slow test: profile one layout, predict others, run
them, compare ``timing/step`` medians after the warm-up step.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from relayrl.monitor.runs import read_records
from relayrl.monitor.schema import TIMING_STEP
from relayrl.plan.model import Layout, overrides, predict
from relayrl.plan.profile import Profile

TINY_WORK = ["run.prompts_per_step=4", "algorithm.group_size=8"]
"""grpo_tiny at 4 prompts x 8 completions (512 tokens a step): steps long enough that the driver's jitter
is small next to them, short enough that a check of several layouts stays a few minutes."""

QUIET = ["logging.wandb=disabled", "logging.console=false", "run.save_final=false", "weightsync.verify_every=0"]
"""A measuring run logs metrics.jsonl only, saves no model and skips the logprob probe (a cost every
``verify_every`` steps that a median over a few steps would catch or miss by chance)."""


def run_layout(
    recipe: str, layout: Layout, steps: int, extra: list[str], output_dir: str | Path, cpu: bool = True
) -> Path:
    """Train ``recipe`` for ``steps`` steps in ``layout`` (overrides from ``plan.overrides``); its run dir."""
    stream = "-stream" if layout.stream else ""
    name = f"plan-{layout.placement}-{layout.split().replace(':', 'x')}-{layout.mode}{layout.k}{stream}"
    return run_overrides(recipe, name, overrides(layout, cpu), steps, extra, output_dir)


def probes(cores: int, prompts: int) -> dict[str, list[str]]:
    """The CPU probes beside the shared N:N run of the recipe's batch (``prompts`` a step): a run on one
    thread a side and one of an N-thread replica beside N one-thread trainer ranks, both at half the batch.
    Their differences give what one run cannot tell apart (``profile._fit_probes``): generation's per-call
    cost and its thread scaling g, training's thread scaling e and the ranks' collectives and gather. Neither
    is a layout the planner predicts: at half the batch, the one-thread run is not separate 1:1."""
    if prompts < 2 or prompts % 2:
        raise ValueError(f"run.prompts_per_step={prompts}: the probes run half the batch; use an even count")
    half = f"run.prompts_per_step={prompts // 2}"
    return {
        "one-thread": [*overrides(Layout("shared", 1, 1), cpu=True), half],
        "ranks": [
            "placement=separate",
            "mode=sync",
            "rollout.num_replicas=1",
            "rollout.num_cpus=1",
            f"rollout.num_threads={cores}",
            f"trainer.world_size={cores}",
            f"trainer.num_cpus={1 / cores:.4g}",  # Ray's CPUs: N ranks beside the replica on N cores
            "trainer.num_threads=1",
            half,
        ],
    }


def run_overrides(
    recipe: str, name: str, layout_overrides: list[str], steps: int, extra: list[str], output_dir: str | Path
) -> Path:
    """Train ``recipe`` for ``steps`` steps with ``layout_overrides`` (then ``extra``); its run dir."""
    import ray

    from relayrl.config import load_config
    from relayrl.controller import train

    cfg = load_config(
        recipe,
        [
            *layout_overrides,
            *QUIET,
            f"run.steps={steps}",
            f"run.name={name}",
            f"run.output_dir={output_dir}",
            *extra,
        ],
    )
    started = not ray.is_initialized()  # a test session's Ray stays up; one this call started goes
    try:
        return train(cfg).run_dir
    finally:
        if started:
            ray.shutdown()


def median_step(run_dir: str | Path, skip: int = 1) -> float:
    """Median ``timing/step`` after the first ``skip`` steps (what the profile's own medians compare with)."""
    return statistics.median(r[TIMING_STEP] for r in read_records(run_dir)[skip:])


@dataclass(frozen=True)
class Check:
    layout: Layout
    predicted_s: float
    measured_s: float
    run_dir: Path
    simulated_s: float = 0.0  # the simulator fed the same profile (``relayrl.plan.calibrate``)

    @property
    def error(self) -> float:
        """|predicted - measured| / measured."""
        return abs(self.predicted_s - self.measured_s) / self.measured_s

    @property
    def sim_error(self) -> float:
        """|simulated - measured| / measured."""
        return abs(self.simulated_s - self.measured_s) / self.measured_s


def check_layouts(
    recipe: str,
    profile_layout: Layout,
    targets: list[Layout],
    steps: int,
    extra: list[str],
    output_dir: str | Path,
    bracket: bool = True,
    probe: bool = False,
) -> tuple[Profile, list[Check]]:
    """Profile ``recipe`` in ``profile_layout`` (one core per device on a CPU box), then predict and run each
    target layout. ``bracket``: profile again after the targets and use both profile runs (their costs
    averaged), so that a machine whose load drifts during the check (a shared box's step times can move
    severalfold within minutes) is profiled at the targets' mean time. The profile runs are the first
    checks: their errors show the drift (one profile run reproduces its own median exactly). A target equal
    to the profile layout is not run again. ``probe``: run the CPU probes (``probes``) after the first
    profile run and profile all of them together."""
    cores = os.cpu_count() or 1
    targets = [layout for layout in targets if layout != profile_layout]  # the profile runs measure it
    runs = [run_layout(recipe, profile_layout, steps, extra, output_dir)]
    probed = []
    if probe:
        from relayrl.config import load_config

        prompts = load_config(recipe, extra).run.prompts_per_step
        probed = [
            run_overrides(recipe, f"probe-{name}", ovr, steps, extra, output_dir)
            for name, ovr in probes(cores, prompts).items()
        ]
    measured = [(layout, run_layout(recipe, layout, steps, extra, output_dir)) for layout in targets]
    if bracket:
        runs.append(run_layout(recipe, profile_layout, steps, extra, output_dir))
    profile = Profile.from_runs([*runs, *probed], cores=cores)
    checks = [_check(profile, profile_layout, run, steps) for run in runs]
    checks += [_check(profile, layout, run, steps) for layout, run in measured]
    return profile, checks


def _check(profile: Profile, layout: Layout, run: Path, steps: int) -> Check:
    """Predicted (the planner's laws), simulated (the simulator on the profile's costs) and measured median
    steps of ``layout``; the simulation skips the same warm-up step as ``median_step``."""
    from relayrl.plan.calibrate import simulate_layout

    simulated = simulate_layout(profile, layout, steps).step_s(skip=1)
    return Check(layout, predict(profile, layout).step_s, median_step(run), run, simulated)
