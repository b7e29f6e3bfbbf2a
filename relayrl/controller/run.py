"""The run directory: resolved config, metrics.jsonl, samples.jsonl, wandb/, plots/, checkpoints/."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relayrl.config import Config


@dataclass
class RunResult:
    run_dir: Path
    rewards: list[float]                  # reward/mean per step
    checkpoint: Path | None

    def window_means(self, k: int = 5) -> tuple[float, float]:
        """Mean reward of the first k and the last k steps (the acceptance figure for learning)."""
        first, last = self.rewards[:k], self.rewards[-k:]
        return sum(first) / max(len(first), 1), sum(last) / max(len(last), 1)


@dataclass
class RunDir:
    cfg: Config
    path: Path
    logger: Any
    rewards: list[float] = field(default_factory=list)

    @classmethod
    def create(cls, cfg: Config) -> "RunDir":
        from omegaconf import OmegaConf

        from relayrl.monitor.metrics import make_logger

        path = Path(cfg.run.output_dir) / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        path.mkdir(parents=True, exist_ok=False)
        resolved = OmegaConf.structured(cfg)
        (path / "config.yaml").write_text(OmegaConf.to_yaml(resolved))
        config_dict = OmegaConf.to_container(resolved)
        config_dict.pop("defaults", None)
        logger = make_logger(cfg.logging, path, config_dict, cfg.run.steps)
        return cls(cfg, path, logger)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        samples = metrics.pop("_samples", None)
        if samples:
            self.logger.log_samples(step, samples)
        self.rewards.append(float(metrics.get("reward/mean", float("nan"))))
        self.logger.log(step, metrics)

    def finish(self, system: Any) -> RunResult:
        """Save the final HF checkpoint, write plots, print the reward curve."""
        from relayrl.monitor.plot import plot_run, reward_curve_ascii

        checkpoint = None
        if self.cfg.run.save_final:
            checkpoint = self.path / "checkpoints" / "final"
            system.trainer.save_hf(str(checkpoint))
        self.logger.close()
        plot_run(self.path)
        result = RunResult(self.path, list(self.rewards), checkpoint)
        first, last = result.window_means()
        print(reward_curve_ascii(self.rewards))
        print(f"reward: first-5 mean {first:.3f} -> last-5 mean {last:.3f} ({last - first:+.3f}); run dir {self.path}")
        return result
