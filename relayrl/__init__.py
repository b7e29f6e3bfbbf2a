"""relayrl: RL post-training for LLMs (Ray controller, vLLM rollouts, FSDP2 trainers).

Python API::

    import relayrl
    cfg = relayrl.load_config("grpo_arith", ["run.steps=10"])
    relayrl.train(cfg, rewards=[my_reward_fn])
"""

from relayrl.config import Config, ConfigError, load_config


def train(cfg: Config, rewards=None):
    """Run ``cfg`` end to end; ``rewards`` is an optional list of reward callables (TRL signature)."""
    from relayrl.controller import train as _train

    return _train(cfg, rewards)


__all__ = ["Config", "ConfigError", "load_config", "train"]
