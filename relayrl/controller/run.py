"""The run directory: status.json, resolved config, metrics.jsonl, samples.jsonl, wandb/, plots/,
checkpoints/, logs/ (README "Run directory" lists them; ``relayrl runs`` reads status.json). logs/ holds
error.log and every actor's and engine's output (``relayrl.logs``: rollout-<pid>.log, trainer-<pid>.log,
rewards.log, ray.log)."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from relayrl.config import Config, ConfigError
from relayrl.controller.checkpoint import Checkpointer, durable_dir, fsync_path, latest, write_durable
from relayrl.logs import capture, crash_tail
from relayrl.monitor.runs import read_jsonl
from relayrl.monitor.schema import REWARD_MEAN, TIMING_CHECKPOINT_STALL
from relayrl.monitor.signal import NoSignal

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    run_dir: Path
    rewards: list[float]  # reward/mean per step
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
    checkpoints: Checkpointer | None = None  # step_N writes; None in a RunDir made without a config
    no_signal: NoSignal = field(default_factory=lambda: NoSignal(0))  # warns of steps with nothing to learn

    @classmethod
    def create(cls, cfg: Config) -> RunDir:
        return cls._open(cfg, new_run_dir(Path(cfg.run.output_dir), cfg.run.name), [])

    @classmethod
    def reopen(cls, cfg: Config, path: Path, state: dict[str, Any] | None) -> RunDir:
        """Continue ``path`` after a resume from the checkpoint with driver ``state`` (None: from step 0).
        Per-step logs are cut back to its step (the steps after it are trained again; a torn last line
        left by a killed writer goes too), the prompt log is checked against it, and the logger appends."""
        step = state["step"] if state else 0
        check_prompt_log(path / "prompts.jsonl", step, state["counts"]["trained"] if state else 0)
        for name in ("metrics.jsonl", "samples.jsonl", "prompts.jsonl"):
            _truncate_steps(path / name, step)
        rows = [
            record for _, record in read_jsonl(path / "metrics.jsonl") if record.get("step", 0) > 0
        ]  # step 0: the initial model's eval, no step
        return cls._open(cfg, path, [float(r.get(REWARD_MEAN, float("nan"))) for r in rows], resumed_from=step)

    @classmethod
    def _open(cls, cfg: Config, path: Path, rewards: list[float], **status: Any) -> RunDir:
        from omegaconf import OmegaConf

        from relayrl.monitor.metrics import make_logger

        resolved = OmegaConf.structured(cfg)
        if not status:  # a new run: its resolved config
            (path / "config.yaml").write_text(OmegaConf.to_yaml(resolved))
        # A structured config's container is a dict keyed by field names (to_container's type covers lists too).
        config_dict = cast(dict[str, Any], OmegaConf.to_container(resolved, resolve=True))
        config_dict.pop("defaults", None)
        checkpoints = Checkpointer(path, cfg.run.keep_checkpoints, cfg.run.checkpoint_async)
        run = cls(cfg, path, None, rewards, checkpoints, NoSignal(cfg.logging.no_signal_steps))
        run.write_status("running", **status)
        capture(path / "logs", cfg.logging.verbose)  # actor and engine output -> logs/*.log
        hint = "" if cfg.logging.verbose else " (--verbose: on the console too)"
        logger.info("relayrl: run dir %s; actor and engine output in %s%s", path, path / "logs", hint)
        run.logger = make_logger(cfg.logging, path, config_dict, cfg.run.steps)
        return run

    def write_status(self, status: str, **extra: Any) -> None:
        """``status.json``: running (with pid and host, so a crashed run can be told apart) | finished | failed |
        interrupted."""
        record = {"status": status, "pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), **extra}
        tmp = self.path / "status.json.tmp"
        write_durable(tmp, json.dumps(record) + "\n")
        tmp.replace(self.path / "status.json")
        fsync_path(self.path)

    def fail(self, exc: BaseException) -> None:
        """Mark the run failed: the error's first line in status.json, the traceback in logs/error.log
        followed by the last lines of the processes the error names, which also go to the console (their
        output went to logs/ only, so a crash is never silent)."""
        (self.path / "logs").mkdir(exist_ok=True)
        tail = crash_tail(exc)
        if tail:
            logger.error("\n".join(tail))
        text = "".join(traceback.format_exception(exc)) + "".join(x + "\n" for x in tail)
        (self.path / "logs" / "error.log").write_text(text)
        self.write_status("failed", error=error_line(exc), steps_done=len(self.rewards))

    def interrupt(self) -> None:
        """Ctrl-C: mark the run interrupted (no traceback: nothing failed) and say in one line what it keeps
        and how to go on. A checkpoint whose write was still pending is not committed (the trainer ranks got
        the signal too); ``run.resume=auto`` takes the latest committed one."""
        self.write_status("interrupted", steps_done=len(self.rewards))
        ckpt = latest(self.path)
        how = (
            f"run.resume=auto continues from {ckpt.name}"
            if ckpt
            else "it has no checkpoint yet, so run.resume=auto would start over"
        )
        logger.warning(
            "relayrl: interrupted after %d step(s); %s keeps their metrics; %s", len(self.rewards), self.path, how
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Log one step under the schema's names (``monitor.schema.to_schema``: the one renaming place)."""
        from relayrl.monitor.schema import to_schema

        samples = metrics.pop("_samples", None)
        if samples:
            self.logger.log_samples(step, samples)
        if self.checkpoints is not None:
            self.checkpoints.poll()  # commit a step_N whose background write has finished
            metrics[TIMING_CHECKPOINT_STALL] = self.checkpoints.take_stall()
        metrics = to_schema(metrics, self.cfg.trainer.lr, self.cfg.rollout.num_replicas)
        self.rewards.append(float(metrics.get(REWARD_MEAN, float("nan"))))
        self.logger.log(step, metrics)
        warning = self.no_signal.observe(metrics)
        if warning:
            logger.warning(warning)

    def finish(self, system: Any) -> RunResult:
        """Save the final HF checkpoint, write plots, print the reward curve."""
        from relayrl.monitor.plot import plot_run, reward_curve_ascii

        if self.checkpoints is not None:
            self.checkpoints.finish()  # the last step_N is on disk and committed
        checkpoint = None
        if self.cfg.run.save_final:  # written aside, fsynced, renamed: never half a model
            checkpoint = durable_dir(self.path / "checkpoints" / "final", lambda tmp: system.trainer.save_hf(str(tmp)))
        self.logger.close()
        plot_run(self.path)
        self.write_status("finished", steps_done=len(self.rewards))
        result = RunResult(self.path, list(self.rewards), checkpoint)
        first, last = result.window_means()
        logger.info(reward_curve_ascii(self.rewards))
        logger.info(
            "reward: first-5 mean %.3f -> last-5 mean %.3f (%+.3f); run dir %s", first, last, last - first, self.path
        )
        return result


def _truncate_steps(path: Path, step: int) -> None:
    """Keep the lines of a per-step jsonl file whose ``step`` is <= ``step`` (atomic, durable rewrite);
    a torn last line is dropped with the rest."""
    if not path.exists():
        return
    keep = [line for line, record in read_jsonl(path) if record.get("step", 0) <= step]
    tmp = path.with_name(path.name + ".tmp")
    write_durable(tmp, "".join(x + "\n" for x in keep))
    tmp.replace(path)


def check_prompt_log(path: Path, step: int, trained: int) -> None:
    """Before cutting back to checkpoint ``step`` (so a refused resume changes nothing): the lines of
    ``prompts.jsonl`` up to ``step`` must be steps 1..``step`` in order with ``trained`` prompt ids in all
    (the checkpoint's ``counts["trained"]``); anything else means the log is not this checkpoint's
    history, and resuming would train on a data order nobody can audit."""
    records = [record for _, record in read_jsonl(path) if record.get("step", 0) <= step]
    steps = [r.get("step") for r in records]
    ids = sum(len(r.get("prompt_ids", [])) for r in records)
    if steps != list(range(1, step + 1)) or ids != trained:
        raise ConfigError(
            f"{path} holds steps {_span(steps)} with {ids} prompt ids, but the checkpoint is at step {step} "
            f"with {trained} trained prompts: this run dir's prompt log does not match its checkpoint; "
            "resume from a checkpoint it matches (run.resume=<run dir>/checkpoints/step_N) or start fresh"
        )


def _span(steps: list) -> str:
    return "none" if not steps else f"{steps[0]}..{steps[-1]} ({len(steps)} lines)"


def new_run_dir(output_dir: Path, name: str, stamp: str | None = None) -> Path:
    """Create ``output_dir/<name>-<stamp>`` (stamp: the time to the second), or ``...-<stamp>-2``, ``-3``
    when another run took it in the same second: ``mkdir`` without ``exist_ok`` is atomic, so two runs
    can never share a directory."""
    output_dir.mkdir(parents=True, exist_ok=True)
    base = f"{name}-{stamp or time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1, 1000):
        path = output_dir / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{output_dir}/{base}-*: 999 runs named {name!r} started in one second")


def error_line(exc: BaseException) -> str:
    """``Type: first line`` of the error that started it: a Ray task's error shows its cause (Ray's own
    first line names only the task), without terminal colour codes."""
    while (cause := getattr(exc, "cause", None)) is not None and cause is not exc:
        exc = cause
    first = (str(exc).strip().splitlines() or [""])[0]
    return re.sub(r"\x1b\[[0-9;]*m", "", f"{type(exc).__name__}: {first}")
