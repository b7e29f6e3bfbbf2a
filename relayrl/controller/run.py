"""The run directory: status.json, resolved config, metrics.jsonl, samples.jsonl, wandb/, plots/,
checkpoints/, logs/ (README "Run directory" lists them; ``relayrl runs`` reads status.json)."""

from __future__ import annotations

import json
import os
import re
import socket
import time
import traceback
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
        config_dict = OmegaConf.to_container(resolved, resolve=True)
        config_dict.pop("defaults", None)
        run = cls(cfg, path, None)
        run.write_status("running")
        run.logger = make_logger(cfg.logging, path, config_dict, cfg.run.steps)
        return run

    @classmethod
    def reopen(cls, cfg: Config, path: Path, step: int) -> "RunDir":
        """Continue ``path`` after a resume from checkpoint ``step``: per-step logs are cut back to it (the
        steps after it are trained again) and the logger appends."""
        from omegaconf import OmegaConf

        from relayrl.monitor.metrics import make_logger

        for name in ("metrics.jsonl", "samples.jsonl", "prompts.jsonl"):
            _truncate_steps(path / name, step)
        rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()] \
            if (path / "metrics.jsonl").exists() else []
        config_dict = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
        config_dict.pop("defaults", None)
        run = cls(cfg, path, None, [float(r.get("reward/mean", float("nan"))) for r in rows])
        run.write_status("running", resumed_from=step)
        run.logger = make_logger(cfg.logging, path, config_dict, cfg.run.steps)
        return run

    def write_status(self, status: str, **extra: Any) -> None:
        """``status.json``: running (with pid and host, so a crashed run can be told apart) | finished | failed."""
        record = {"status": status, "pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), **extra}
        tmp = self.path / "status.json.tmp"
        tmp.write_text(json.dumps(record) + "\n")
        tmp.replace(self.path / "status.json")

    def fail(self, exc: BaseException) -> None:
        """Mark the run failed: the error's first line in status.json, the traceback in logs/error.log."""
        (self.path / "logs").mkdir(exist_ok=True)
        (self.path / "logs" / "error.log").write_text("".join(traceback.format_exception(exc)))
        self.write_status("failed", error=error_line(exc), steps_done=len(self.rewards))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Log one step under the schema's names (``monitor.schema.to_schema``: the one renaming place)."""
        from relayrl.monitor.schema import to_schema

        samples = metrics.pop("_samples", None)
        if samples:
            self.logger.log_samples(step, samples)
        metrics = to_schema(metrics, self.cfg.trainer.lr, self.cfg.rollout.num_replicas)
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
        self.write_status("finished", steps_done=len(self.rewards))
        result = RunResult(self.path, list(self.rewards), checkpoint)
        first, last = result.window_means()
        print(reward_curve_ascii(self.rewards))
        print(f"reward: first-5 mean {first:.3f} -> last-5 mean {last:.3f} ({last - first:+.3f}); run dir {self.path}")
        return result


def _truncate_steps(path: Path, step: int) -> None:
    """Keep the lines of a per-step jsonl file whose ``step`` is <= ``step`` (atomic rewrite)."""
    if not path.exists():
        return
    keep = [x for x in path.read_text().splitlines() if x.strip() and json.loads(x).get("step", 0) <= step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    tmp.replace(path)


def error_line(exc: BaseException) -> str:
    """``Type: first line`` of the error that started it: a Ray task's error shows its cause (Ray's own
    first line names only the task), without terminal colour codes."""
    while getattr(exc, "cause", None) is not None and exc.cause is not exc:
        exc = exc.cause
    first = (str(exc).strip().splitlines() or [""])[0]
    return re.sub(r"\x1b\[[0-9;]*m", "", f"{type(exc).__name__}: {first}")
