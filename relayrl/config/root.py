"""The root ``Config``: one field per section, and its registration in Hydra's ConfigStore (the one
place the schema is stored, so recipes are composed and checked against it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from relayrl.config.algorithm import AlgorithmConfig, CriticConfig
from relayrl.config.base import ConfigError, one_of
from relayrl.config.buffer import BufferConfig
from relayrl.config.data import DataConfig
from relayrl.config.env import EnvConfig
from relayrl.config.eval import EvalConfig
from relayrl.config.logging import LoggingConfig
from relayrl.config.model import ModelConfig
from relayrl.config.placement import PlacementConfig, PlacementMode
from relayrl.config.reward import RewardConfig, RewardSpec
from relayrl.config.rollout import RolloutConfig
from relayrl.config.run import RunConfig
from relayrl.config.sft import SftConfig
from relayrl.config.trainer import TrainerConfig
from relayrl.config.weightsync import WeightSyncConfig

Mode = Literal["sync", "async"]
"""Values of ``mode``, a ``str`` field checked against them (``base`` says why)."""


@dataclass
class Config:
    defaults: list[Any] = field(default_factory=lambda: [{"placement": "separate"}, "_self_"])
    """Hydra defaults list: makes ``placement=separate|colocated`` a config-group choice."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    weightsync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    placement: PlacementConfig = MISSING
    rewards: list[RewardSpec] = field(default_factory=lambda: [RewardSpec()])
    reward: RewardConfig = field(default_factory=RewardConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    mode: str = "sync"
    """sync: generate -> score -> train -> sync, strictly on-policy. async: rollout keeps generating while
    the trainer trains, at most buffer.max_staleness versions ahead; weights land in flight."""

    def __post_init__(self) -> None:
        one_of("mode", self.mode, Mode)
        if not self.rewards:
            raise ConfigError("rewards is empty; add at least one reward, e.g. rewards=[{fn: module:function}]")


def register_configs() -> None:
    """Register the schema so recipes (``defaults: [relayrl_schema, _self_]``) are checked against it."""
    cs = ConfigStore.instance()
    cs.store(name="relayrl_schema", node=Config)
    for mode in get_args(PlacementMode):  # separate, colocated
        cs.store(group="placement", name=mode, node=PlacementConfig(mode=mode))
