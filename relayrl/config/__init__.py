"""Typed configuration: one dataclass per component, registered in Hydra's ConfigStore.

The dataclasses are the single source of truth. Recipes in ``recipes/`` hold only what differs from
their defaults and are validated against them when composed (a wrong key or type is an error). Each
section checks its own fields when it is built (``__post_init__``); ``validate`` then checks the
rules that span sections. Every error is raised as ``ConfigError`` with one line naming the field
and the fix, before any actor starts. Checks that need the model, the dataset rows or the reward
functions themselves run later, still before Ray starts: ``relayrl.preflight``.

One module per section::

    base        ConfigError, the positive / one-of checks, why choices are Literal-checked str
    model       ModelConfig                     data        DataConfig, FILE_TASKS, GENERATED_TASKS
    rollout     RolloutConfig                   env         EnvConfig
    trainer     TrainerConfig, LoraConfig       algorithm   AlgorithmConfig, CriticConfig
    weightsync  WeightSyncConfig                buffer      BufferConfig
    placement   PlacementConfig                 reward      RewardSpec, RewardConfig
    logging     LoggingConfig                   eval        EvalConfig
    run         RunConfig                       root        Config, register_configs (ConfigStore)
    sft         SftConfig (warm start)
    validation  validate, fill_defaults         load        load_config, RECIPES_DIR
    runtime     has_cuda and the Ray workers' environment (WORKER_ENV, CPU_MALLOC_ENV, LONG_ROWS_MALLOC_ENV)
"""

from relayrl.config.algorithm import GROUPED_ESTIMATORS, AlgorithmConfig, CriticConfig
from relayrl.config.base import ConfigError
from relayrl.config.buffer import BufferConfig
from relayrl.config.data import FILE_TASKS, GENERATED_TASKS, DataConfig
from relayrl.config.env import EnvConfig
from relayrl.config.eval import EvalConfig
from relayrl.config.load import RECIPES_DIR, load_config
from relayrl.config.logging import LoggingConfig
from relayrl.config.model import ModelConfig
from relayrl.config.placement import PlacementConfig
from relayrl.config.reward import RewardConfig, RewardSpec
from relayrl.config.rollout import RolloutConfig
from relayrl.config.root import Config, register_configs
from relayrl.config.run import RunConfig
from relayrl.config.runtime import CPU_MALLOC_ENV, LONG_ROWS_MALLOC_ENV, WORKER_ENV, has_cuda, malloc_env, with_env
from relayrl.config.sft import SftConfig
from relayrl.config.trainer import LLAMA_LINEARS, LoraConfig, TrainerConfig
from relayrl.config.validation import validate
from relayrl.config.weightsync import WeightSyncConfig

__all__ = [
    "CPU_MALLOC_ENV",
    "FILE_TASKS",
    "GENERATED_TASKS",
    "GROUPED_ESTIMATORS",
    "LLAMA_LINEARS",
    "LONG_ROWS_MALLOC_ENV",
    "RECIPES_DIR",
    "WORKER_ENV",
    "AlgorithmConfig",
    "BufferConfig",
    "Config",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "EnvConfig",
    "EvalConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "PlacementConfig",
    "RewardConfig",
    "RewardSpec",
    "RolloutConfig",
    "RunConfig",
    "SftConfig",
    "TrainerConfig",
    "WeightSyncConfig",
    "has_cuda",
    "load_config",
    "malloc_env",
    "register_configs",
    "validate",
    "with_env",
]
