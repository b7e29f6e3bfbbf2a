"""The controller: one Ray driver that starts the actors and runs the synchronous GRPO loop.

::

    ┌──────────┐ prompts ┌────────────────┐ refs ┌─────────────┐ refs ┌──────────────────┐
    │ sampler  │────────▶│ RolloutActor×N │─────▶│ reward pool │─────▶│ TrainerGroup     │
    │ (driver) │         │ (vLLM AsyncLLM)│      │ (Ray procs) │      │ FSDP2 ranks      │
    └──────────┘         └───────▲────────┘      └─────────────┘      └────────┬─────────┘
                                 │  weights v+1: start→transfer→verify→commit  │
                                 └─────────────────────────────────────────────┘

The driver holds actor handles, object refs and small metric dicts only: trajectories travel
rollout -> reward pool -> trainer ranks as Ray object refs and are never pulled into this process.
One step, strictly on-policy (``mode=sync``):
sample prompts -> generate G completions each -> score -> (trainer: advantages, old/ref logprobs,
update) -> sync weights to every engine at version=step -> log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import ray

from relayrl.config import Config, ConfigError
from relayrl.controller.cluster import make_placement, needed_cpus, start_ray
from relayrl.controller.run import RunDir, RunResult
from relayrl.controller.system import System


def train(cfg: Config, rewards: list[Callable] | None = None) -> RunResult:
    """Run a recipe end to end; ``rewards`` (callables) replace ``cfg.rewards`` when given."""
    reward_fns = resolve_rewards(cfg, rewards)          # import errors surface before Ray starts
    model_path = resolve_model_path(cfg)
    run = RunDir.create(cfg)
    start_ray(cfg.run.ray_address, cfg.placement, needed_cpus(cfg.rollout, cfg.trainer, cfg.placement))
    placement = make_placement(cfg.rollout, cfg.trainer, cfg.placement)
    try:
        system = System.start(cfg, model_path, placement, reward_fns, run)
        try:
            loop(cfg, system, run)
            return run.finish(system)
        finally:
            system.shutdown()
    finally:
        run.logger.close()  # idempotent; metrics.jsonl is flushed line by line anyway
        ray.util.remove_placement_group(placement.group)


def loop(cfg: Config, system: System, run: RunDir) -> None:
    """The synchronous loop; each line is one stage, timed."""
    for step in range(1, cfg.run.steps + 1):
        timer = StageTimer()
        prompts = system.sampler.next_batch()
        with timer("generate"):
            group_refs = system.generate(prompts)                 # refs, one per replica
        with timer("score"):
            scored_refs, reward_stats = system.score(group_refs)  # refs + small metric dict
        with timer("train"):
            train_stats = system.trainer.train_step(scored_refs)  # advantages, old/ref logprobs, update
        with timer("sync"):
            sync_stats = system.sync_weights(version=step)
            sync_stats |= system.verify_sync(step, scored_refs)       # every weightsync.verify_every
        run.log(step, {**reward_stats, **train_stats, **sync_stats, **timer.metrics()})


def resolve_rewards(cfg: Config, rewards: list[Callable] | None) -> list[tuple[str, Callable, float]]:
    """``[(name, fn, weight)]`` from callables given to ``train`` or from the recipe's import paths."""
    from relayrl.rewards import load_reward_fns

    if rewards:
        return [(getattr(fn, "__name__", f"reward{i}"), fn, 1.0) for i, fn in enumerate(rewards)]
    try:
        return load_reward_fns([(spec.fn, spec.weight, spec.kwargs) for spec in cfg.rewards])
    except ValueError as exc:
        raise ConfigError(f"rewards: {exc}") from None


def resolve_model_path(cfg: Config) -> Path:
    from relayrl.models import resolve_model

    try:
        return resolve_model(cfg.model.path)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None


class StageTimer:
    """``with timer("generate"): ...`` records wall seconds per stage as ``timing/<stage>``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.start = time.perf_counter()

    @contextmanager
    def __call__(self, stage: str):
        t0 = time.perf_counter()
        yield
        self.seconds[stage] = time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        out = {f"timing/{k}": v for k, v in self.seconds.items()}
        out["timing/step"] = time.perf_counter() - self.start
        return out


__all__ = ["train", "loop", "StageTimer"]
