"""The controller: one Ray driver that starts the actors and runs the training loop.

::

    ┌──────────┐ prompts ┌────────────────┐ refs ┌─────────────┐ refs ┌──────────────────┐
    │ sampler  │────────▶│ RolloutActor×N │─────▶│ reward pool │─────▶│ TrainerGroup     │
    │ (driver) │         │ (vLLM AsyncLLM)│      │ (Ray procs) │      │ FSDP2 ranks      │
    └──────────┘         └───────▲────────┘      └─────────────┘      └────────┬─────────┘
                                 │  weights v+1: start→transfer→verify→commit  │
                                 └─────────────────────────────────────────────┘

The driver holds actor handles, object refs and small metric dicts only: trajectories travel
rollout -> reward pool -> trainer ranks as Ray object refs and are never pulled into this process.
One step: sample prompts -> generate G completions each -> score -> (trainer: advantages, old/ref
logprobs, update) -> sync weights to every engine at version=step -> log. ``mode=sync`` runs these
in order, strictly on-policy; ``mode=async`` overlaps generation with training, at most
``buffer.max_staleness`` versions apart (``controller/scheduler.py`` draws both).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from relayrl.config import Config, ConfigError
from relayrl.controller.cluster import make_placement, needed_cpus, relative_output_dir, split_cores, start_ray
from relayrl.controller.faults import TrainerDied
from relayrl.controller.run import RunDir, RunResult
from relayrl.controller.system import System
from relayrl.logs import show_on_console
from relayrl.preflight import resolve_model_path, resolve_rewards
from relayrl.rollout.actor import keep_driver_forkserver

logger = logging.getLogger(__name__)


def train(cfg: Config, rewards: list[Callable] | None = None) -> RunResult:
    """Run a recipe end to end; ``rewards`` (callables) replace ``cfg.rewards`` when given.

    If a trainer rank dies, the whole system is torn down and started again from the run's latest
    checkpoint (from scratch if there is none yet), at most ``trainer.max_restarts`` times.
    """
    show_on_console()  # the Python API's console, as the CLI's
    cfg = split_cores(cfg)  # async on CPU: engines and ranks share the cores
    keep_driver_forkserver(cfg)  # `relayrl train` started one at launch
    reward_fns = resolve_rewards(cfg, rewards)  # preflight: import errors surface before Ray starts
    model_path = resolve_model_path(cfg)  # preflight: model, context, KV cache, dataset, prompts
    resume = resolve_resume(cfg)  # (run dir, checkpoint, state) or None, before Ray starts
    if warning := relative_output_dir(cfg.run.output_dir, cfg.run.ray_address, os.environ):
        logger.warning(warning)
    run = RunDir.reopen(cfg, resume[0], resume[2]) if resume else RunDir.create(cfg)
    placement = None
    try:  # from here on, status.json says how the run ended
        if cfg.sft.steps:  # before Ray: the warm start has the cores to itself
            from relayrl.trainer.sft import warm_start

            model_path = warm_start(cfg, model_path, run.path / "sft")
        start_ray(cfg.run.ray_address, cfg.placement, needed_cpus(cfg.rollout, cfg.trainer, cfg.placement))
        placement = make_placement(cfg.rollout, cfg.trainer, cfg.placement)
        run.logger.ready()  # wandb started beside ray.init; its error stops us before actors
        for restart in range(cfg.trainer.max_restarts):
            try:
                return run_once(cfg, model_path, placement, reward_fns, run, resume)
            except TrainerDied as exc:
                resume, run = restart_point(cfg, run)
                logger.warning(
                    "relayrl: %s; restarting from %s (%d/%d)",
                    exc,
                    resume[1].name if resume else "the start",
                    restart + 1,
                    cfg.trainer.max_restarts,
                )
        return run_once(cfg, model_path, placement, reward_fns, run, resume)  # the last attempt: a death raises
    except KeyboardInterrupt:
        run.interrupt()  # Ctrl-C: status.json says interrupted; one line says what is kept
        raise
    except BaseException as exc:
        run.fail(exc)  # status.json says failed; logs/error.log has the traceback
        raise
    finally:
        run.logger.close()  # idempotent; metrics.jsonl is flushed line by line anyway
        if placement is not None:
            ray.util.remove_placement_group(placement.group)


def run_once(
    cfg: Config, model_path: Path, placement: Any, reward_fns: list, run: RunDir, resume: tuple | None
) -> RunResult:
    system = System.start(cfg, model_path, placement, reward_fns, run)
    try:
        loop(cfg, system, run, resume)
        return run.finish(system)
    finally:
        system.shutdown()


def restart_point(cfg: Config, run: RunDir) -> tuple[tuple | None, RunDir]:
    """After a trainer death: the run's latest verified checkpoint (or none) and the run dir reopened at it.
    A checkpoint whose background write was still pending is given up (the dead rank's shards may be
    missing); the next save deletes its temporary directory."""
    from relayrl.controller import checkpoint

    run.logger.close()
    ckpt = checkpoint.latest_verified(run.path)
    resume = (run.path, ckpt, checkpoint.driver_state(ckpt)) if ckpt else None
    return resume, RunDir.reopen(cfg, run.path, resume[2] if resume else None)


def loop(cfg: Config, system: System, run: RunDir, resume: tuple | None = None) -> None:
    """Both modes run the scheduler (``controller/scheduler.py``): sync is its k = 0 case. On resume the
    trainer loads its shards, the engines get those weights at the checkpoint's version, and the data
    continues from the saved cursor."""
    from relayrl.controller.scheduler import Scheduler

    scheduler = Scheduler(cfg, system, run)
    if resume:
        _, ckpt, state = resume
        system.trainer.load_checkpoint(str(ckpt))
        system.sync_weights(state["step"])
        scheduler.restore(state)
        logger.info("relayrl: resumed %s from %s (step %s)", run.path, ckpt.name, state["step"])
    scheduler.run_steps()


def resolve_resume(cfg: Config) -> tuple[Path, Path, dict] | None:
    """``run.resume`` -> (run dir, checkpoint dir, driver state), or None to start fresh. The checkpoint
    is verified here, before its ``driver.json`` is read, and again by each trainer rank that loads it."""
    from relayrl.controller import checkpoint
    from relayrl.trainer.manifest import UntrustedCheckpoint

    if not cfg.run.resume:
        return None
    try:
        found = checkpoint.find_resume(cfg.run.output_dir, cfg.run.name, cfg.run.resume)
    except (FileNotFoundError, UntrustedCheckpoint) as exc:
        raise ConfigError(str(exc)) from None
    if found is None:
        logger.info("relayrl: run.resume=auto found no verified checkpoint of %r; starting fresh", cfg.run.name)
        return None
    state = checkpoint.driver_state(found[1])
    return found[0], found[1], state


__all__ = ["loop", "train"]
