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

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from relayrl.config import Config, ConfigError
from relayrl.controller.cluster import make_placement, needed_cpus, split_cores, start_ray
from relayrl.controller.run import RunDir, RunResult
from relayrl.controller.faults import TrainerDied
from relayrl.controller.system import System
from relayrl.rollout.actor import keep_driver_forkserver


def train(cfg: Config, rewards: list[Callable] | None = None) -> RunResult:
    """Run a recipe end to end; ``rewards`` (callables) replace ``cfg.rewards`` when given.

    If a trainer rank dies, the whole system is torn down and started again from the run's latest
    checkpoint (from scratch if there is none yet), at most ``trainer.max_restarts`` times.
    """
    cfg = split_cores(cfg)                              # async on CPU: engines and ranks share the cores
    keep_driver_forkserver(cfg)                         # `relayrl train` started one at launch
    reward_fns = resolve_rewards(cfg, rewards)          # import errors surface before Ray starts
    model_path = resolve_model_path(cfg)
    resume = resolve_resume(cfg)                        # (run dir, checkpoint, state) or None, before Ray starts
    run = RunDir.reopen(cfg, resume[0], resume[2]) if resume else RunDir.create(cfg)
    placement = None
    try:                                       # from here on, status.json says how the run ended
        start_ray(cfg.run.ray_address, cfg.placement, needed_cpus(cfg.rollout, cfg.trainer, cfg.placement))
        placement = make_placement(cfg.rollout, cfg.trainer, cfg.placement)
        run.logger.ready()                     # wandb started beside ray.init; its error stops us before actors
        for restart in range(cfg.trainer.max_restarts + 1):
            try:
                return run_once(cfg, model_path, placement, reward_fns, run, resume)
            except TrainerDied as exc:
                if restart == cfg.trainer.max_restarts:
                    raise
                resume, run = restart_point(cfg, run)
                print(f"relayrl: {exc}; restarting from {resume[1].name if resume else 'the start'} "
                      f"({restart + 1}/{cfg.trainer.max_restarts})")
    except KeyboardInterrupt:
        run.interrupt()                        # Ctrl-C: status.json says interrupted; one line says what is kept
        raise
    except BaseException as exc:
        run.fail(exc)                          # status.json says failed; logs/error.log has the traceback
        raise
    finally:
        run.logger.close()  # idempotent; metrics.jsonl is flushed line by line anyway
        if placement is not None:
            ray.util.remove_placement_group(placement.group)


def run_once(cfg: Config, model_path: Path, placement: Any, reward_fns: list, run: RunDir,
             resume: tuple | None) -> RunResult:
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
        print(f"relayrl: resumed {run.path} from {ckpt.name} (step {state['step']})")
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
        print(f"relayrl: run.resume=auto found no verified checkpoint of {cfg.run.name!r}; starting fresh")
        return None
    state = checkpoint.driver_state(found[1])
    return found[0], found[1], state


def resolve_rewards(cfg: Config, rewards: list[Callable] | None) -> list[tuple[str, Callable, float]]:
    """``[(name, fn, weight)]`` from callables given to ``train`` or from the recipe's import paths."""
    from relayrl.rewards import load_reward_fns

    if rewards:
        return [(getattr(fn, "__name__", f"reward{i}"), fn, 1.0) for i, fn in enumerate(rewards)]
    try:
        return load_reward_fns([(spec.fn, spec.weight, spec.kwargs) for spec in cfg.rewards], cfg.reward.sandbox)
    except ValueError as exc:
        raise ConfigError(f"rewards: {exc}") from None


def resolve_model_path(cfg: Config) -> Path:
    """The model directory, checked against the config: context length, and a non-empty dataset."""
    from relayrl.models import resolve_model

    try:
        path = resolve_model(cfg.model.path)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    check_context(cfg, path)
    check_data(cfg, path)
    return path


def check_context(cfg: Config, path: Path) -> None:
    """``model.max_model_len`` within the model's positions, room for a prompt beside ``max_tokens``, and
    attention heads that ``trainer.tp_size`` divides."""
    import json

    from relayrl.trainer.tp import check_heads

    model_config = json.loads((Path(path) / "config.json").read_text())
    if cfg.trainer.tp_size > 1 and "num_attention_heads" in model_config:
        try:
            check_heads(model_config, cfg.trainer.tp_size)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    positions = model_config.get("max_position_embeddings")
    if positions and cfg.model.max_model_len > positions:
        raise ConfigError(f"model.max_model_len={cfg.model.max_model_len} exceeds the model's context "
                          f"({positions} positions); set model.max_model_len<={positions}")
    if cfg.rollout.max_tokens >= cfg.model.max_model_len:
        raise ConfigError(f"rollout.max_tokens={cfg.rollout.max_tokens} leaves no room for the prompt in "
                          f"model.max_model_len={cfg.model.max_model_len}; lower max_tokens or raise max_model_len")
    check_kv_cache(cfg, model_config)


def check_kv_cache(cfg: Config, model_config: dict) -> None:
    """``rollout.kv_cache_gb`` holds at least one ``model.max_model_len`` sequence, which vLLM requires at
    engine start (it would fail there, after Ray and the actors started, naming its own memory knobs).
    Per token and engine worker: K and V for each layer's KV heads, ``rollout.tp_size`` sharing the heads."""
    try:
        layers, heads = model_config["num_hidden_layers"], model_config["num_attention_heads"]
        kv_heads = model_config.get("num_key_value_heads") or heads
        head_dim = model_config.get("head_dim") or model_config["hidden_size"] // heads
    except KeyError:
        return                                  # a layout this check does not know: vLLM's own check stands
    itemsize = 2 if cfg.model.dtype == "bfloat16" else 4    # model.dtype is float32 or bfloat16 (checked)
    per_token = 2 * layers * max(1, kv_heads // cfg.rollout.tp_size) * head_dim * itemsize
    need_gb = per_token * cfg.model.max_model_len / 2**30
    if need_gb > cfg.rollout.kv_cache_gb:
        raise ConfigError(f"rollout.kv_cache_gb={cfg.rollout.kv_cache_gb} is less than one "
                          f"model.max_model_len={cfg.model.max_model_len} sequence of this model's KV cache "
                          f"({need_gb:.3f} GB); raise rollout.kv_cache_gb or lower model.max_model_len")


def check_data(cfg: Config, model_path: Path) -> None:
    """Load the prompts once before Ray starts: a malformed row, an empty dataset or a prompt too long for
    the engine fails here, in one line, instead of as a task error on every replica and retry."""
    from relayrl.data import load_task

    try:
        rows = load_task(cfg.data)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    if not rows:
        raise ConfigError(f"the dataset ({cfg.data.task}{': ' + cfg.data.path if cfg.data.path else ''}) has "
                          "no rows; point data.path at a non-empty dataset")
    check_prompt_lengths(cfg, model_path, rows)


def check_prompt_lengths(cfg: Config, model_path: Path, rows: list[dict]) -> None:
    """Every prompt, formatted as the sampler formats it, must leave ``rollout.max_tokens`` of room in
    ``model.max_model_len`` (vLLM rejects a prompt that fills the context and cuts completions that run
    into it). Files: every row; generated tasks: the longest distinct questions (``MAX_GENERATED_CHECKED``).
    A multi-turn environment's ``reset`` may add text; the episode runner checks that part at run time."""
    from relayrl.config import FILE_TASKS
    from relayrl.data.lengths import MAX_GENERATED_CHECKED, longest_prompt
    from relayrl.data.sampler import chat_formatter
    from relayrl.models import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    try:
        format_prompt = chat_formatter(tokenizer, cfg.data.chat_template)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    limit = None if cfg.data.task in FILE_TASKS else MAX_GENERATED_CHECKED
    found = longest_prompt(rows, tokenizer, format_prompt, limit)
    budget = cfg.model.max_model_len - cfg.rollout.max_tokens
    if found.tokens > budget:
        source = cfg.data.path if cfg.data.task in FILE_TASKS else f"data.task={cfg.data.task}"
        raise ConfigError(
            f"{source} row {found.row} ({found.question[:40]!r}...) is {found.tokens} prompt tokens; with "
            f"rollout.max_tokens={cfg.rollout.max_tokens} it needs model.max_model_len>="
            f"{found.tokens + cfg.rollout.max_tokens} (now {cfg.model.max_model_len}): raise "
            f"model.max_model_len, lower rollout.max_tokens or shorten that row")


__all__ = ["train", "loop"]
