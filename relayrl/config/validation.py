"""The rules that span sections, in one place. Each section checks its own fields when it is built
(``__post_init__``); ``validate`` checks the combinations, and ``fill_defaults`` sets the defaults
that depend on another section. ``load_config`` runs both on every composed recipe."""

from __future__ import annotations

from relayrl.config.base import ConfigError
from relayrl.config.root import Config


def validate(cfg: Config) -> Config:
    """Rules that span sections (each section checked its own fields when it was built); raise
    ``ConfigError`` naming the field and the fix."""
    _validate_tp(cfg)
    _validate_env(cfg)
    _validate_placement(cfg)
    if cfg.run.prompts_per_step % cfg.rollout.num_replicas:
        raise ConfigError(
            f"run.prompts_per_step={cfg.run.prompts_per_step} must be a multiple of "
            f"rollout.num_replicas={cfg.rollout.num_replicas} (each replica generates an equal share)"
        )
    if cfg.buffer.capacity is not None and cfg.buffer.capacity < cfg.run.prompts_per_step:
        raise ConfigError(
            f"buffer.capacity={cfg.buffer.capacity} is below run.prompts_per_step="
            f"{cfg.run.prompts_per_step}: a step could never fill; raise it or set null"
        )
    algo = cfg.algorithm
    if cfg.rollout.stream and 0 < cfg.rollout.in_flight < algo.group_size:
        raise ConfigError(
            f"rollout.in_flight={cfg.rollout.in_flight} holds less than one group of algorithm.group_size="
            f"{algo.group_size} sequences; set rollout.in_flight to a multiple of it (0: a chunk's worth)"
        )
    if algo.overlong_buffer and algo.overlong_max_len is not None and algo.overlong_buffer > algo.overlong_max_len:
        raise ConfigError(
            f"algorithm.overlong_buffer={algo.overlong_buffer} exceeds overlong_max_len="
            f"{algo.overlong_max_len} (rollout.max_tokens by default); set it to about a fifth of that"
        )
    if cfg.eval.every and cfg.env.name:
        raise ConfigError(
            f"eval.every={cfg.eval.every} scores single-turn completions, but env.name="
            f"{cfg.env.name} makes episodes multi-turn; set eval.every=0"
        )
    return cfg


def _validate_placement(cfg: Config) -> None:
    """Colocated rollout fits in the trainer's resources, and its engines take each version in the hand-over."""
    if cfg.placement.mode == "colocated" and cfg.weightsync.pull_when != "sync":
        raise ConfigError(
            f"placement=colocated hands the weights over in every sync, but weightsync.pull_when="
            f"{cfg.weightsync.pull_when} defers the fetch to the next call; use weightsync.pull_when=sync"
        )
    if cfg.placement.mode == "colocated":
        rollout_cpus = cfg.rollout.num_replicas * cfg.rollout.num_cpus
        trainer_cpus = cfg.trainer.world_size * cfg.trainer.num_cpus
        if rollout_cpus > trainer_cpus:
            raise ConfigError(
                f"placement=colocated needs rollout resources within the trainer's, but rollout asks "
                f"{rollout_cpus:g} CPUs (rollout.num_replicas x rollout.num_cpus) and the trainer has "
                f"{trainer_cpus:g}; lower rollout.num_replicas/rollout.num_cpus or use placement=separate"
            )


def _validate_tp(cfg: Config) -> None:
    """``trainer.tp_size`` and ``trainer.cp_size`` train no critic; ``rollout.tp_size`` > 1 needs its own bundles.
    (``TrainerConfig`` checks that tp_size divides the ranks, ``RolloutConfig`` that tp_size > 1
    has GPUs; ``preflight.check_context`` and ``trainer/tp.py`` check head counts against the
    model.)"""
    t = cfg.trainer
    from relayrl.algorithms.advantages import CRITIC_ESTIMATORS

    if t.tp_size > 1 and cfg.algorithm.name in CRITIC_ESTIMATORS:
        raise ConfigError(
            f"PPO's critic (algorithm.name={cfg.algorithm.name}) is trained with FSDP only; set trainer.tp_size=1"
        )
    if t.cp_size > 1 and cfg.algorithm.name in CRITIC_ESTIMATORS:
        raise ConfigError(
            f"PPO's critic (algorithm.name={cfg.algorithm.name}) runs without context parallelism; "
            "set trainer.cp_size=1"
        )
    if cfg.rollout.workers > 1 and cfg.placement.mode == "colocated":
        raise ConfigError(
            "placement=colocated shares one trainer bundle (one GPU) per rollout replica; "
            "set rollout.tp_size=1 rollout.pp_size=1 or placement=separate"
        )


def _validate_env(cfg: Config) -> None:
    """``env_reward`` needs an environment (``EnvConfig`` checks that ``env.name`` loads)."""
    uses_env_reward = any(spec.fn in ("env_reward", "relayrl.rewards.builtin:env_reward") for spec in cfg.rewards)
    if cfg.env.name is None and uses_env_reward:
        raise ConfigError(
            "rewards use env_reward but env.name is not set; set env.name=calculator "
            "(or another environment) or drop the env_reward reward"
        )


def fill_defaults(cfg: Config) -> Config:
    """Defaults that depend on another section: ``algorithm.norm_len`` and ``algorithm.overlong_max_len`` =
    ``rollout.max_tokens`` (Dr.GRPO's L, DAPO's L_max);
    ``algorithm.off_policy=auto`` -> tis when training can be off-policy (async, k >= 1), else none;
    ``rollout.in_flight`` = a chunk's sequences when streaming."""
    if cfg.algorithm.norm_len is None:
        cfg.algorithm.norm_len = cfg.rollout.max_tokens
    if cfg.algorithm.overlong_max_len is None:
        cfg.algorithm.overlong_max_len = cfg.rollout.max_tokens
    if cfg.rollout.stream and not cfg.rollout.in_flight:
        cfg.rollout.in_flight = cfg.run.prompts_per_step // cfg.rollout.num_replicas * cfg.algorithm.group_size
    if cfg.algorithm.off_policy == "auto":
        off = cfg.mode == "async" and cfg.buffer.max_staleness >= 1
        cfg.algorithm.off_policy = "tis" if off else "none"
    return cfg
