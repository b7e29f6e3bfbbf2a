"""One metrics interface (``MetricsLogger``) fanning out to pluggable sinks.

Sinks: ``ConsoleSink`` (one progress line per step), ``JsonlSink`` (``metrics.jsonl`` and
``samples.jsonl`` in the run dir; what ``relayrl plot`` reads), ``WandbSink`` (offline by default,
files under ``<run_dir>/wandb``) and ``NoopSink`` (tests and disabled logging). Every sink has the
same three methods, so the training loop never checks which ones are on.

Metric names are ``section/name`` (``reward/mean``, ``timing/step``), all listed with units and meanings
in ``relayrl/monitor/schema.py``; values are plain floats.
"""

from __future__ import annotations

import json
import math
import secrets
import string
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, Protocol, cast

from relayrl.config import LoggingConfig
from relayrl.monitor.schema import (
    POLICY_APPROX_KL,
    POLICY_KL,
    POLICY_SKIPPED_GROUPS,
    REWARD_MEAN,
    REWARD_PASS_RATE,
    REWARD_STD,
    STALENESS_MAX,
    TIMING_STEP,
)

KL_KEYS = (POLICY_KL, POLICY_APPROX_KL)
"""The KL the console shows, first present: to the reference (0 without one), else the step's own change."""


def is_kl_key(key: str) -> bool:
    """KL metrics are recognised by name: the last ``/`` part starts or ends with ``kl`` (``train/approx_kl``)."""
    last = key.rsplit("/", 1)[-1]
    return last.startswith("kl") or last.endswith("kl")


class Sink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...
    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None: ...
    def close(self) -> None: ...


class NoopSink:
    """Accepts everything, writes nothing."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass


def _scalar(value: Any) -> Any:
    """Tensors and numpy scalars -> Python numbers; anything else (e.g. str) passes through."""
    return value.item() if hasattr(value, "item") else value


def _json_value(value: Any) -> Any:
    """Strict JSON: non-finite floats become null (``json`` would write the non-standard ``NaN``)."""
    value = _scalar(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)


class JsonlSink:
    """``metrics.jsonl``: ``{"step", "wall_time", **metrics}`` per step; ``samples.jsonl``: ``{"step", **row}``.

    Files are appended to and flushed per line, so a crashed or resumed run keeps what was written.
    """

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8", buffering=1)
        self._samples = (self.run_dir / "samples.jsonl").open("a", encoding="utf-8", buffering=1)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, "wall_time": time.time(), **{k: _json_value(v) for k, v in metrics.items()}}
        self._metrics.write(json.dumps(record) + "\n")

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._samples.write(json.dumps({"step": step, **{k: _json_value(v) for k, v in row.items()}}) + "\n")

    def close(self) -> None:
        self._metrics.close()
        self._samples.close()


class ConsoleSink:
    """One compact line per step, and on a terminal a live progress bar under the lines.

    Line: ``step 3/20 | reward 0.512 ±0.210 | pass 0.38 | skipped 2 flat groups | kl 1.2e-03 | stale 1 | 4.3 s/step |
    ETA 1:12`` (fields whose metric the step lacks, or a 0 count of skipped groups, are left out).
    Bar: ``train ━━━━━━━━━          3/20 reward 0.512 | stale 1 | ETA 1:12 0:00:13`` (+ elapsed time).
    The bar is drawn only when the console is a terminal, so CI logs and pipes keep plain lines.
    ETA = mean step seconds so far x steps left (the mean is steadier than the last step alone).
    """

    def __init__(self, total_steps: int, console: Any = None, live: bool | None = None):
        from rich.console import Console

        self.total_steps = total_steps
        self.console = console or Console(highlight=False, soft_wrap=True)
        self._step_seconds: list[float] = []
        self._last = time.perf_counter()
        self.progress = self._start_bar() if (self.console.is_terminal if live is None else live) else None

    def _start_bar(self) -> Any:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "reward [cyan]{task.fields[reward]}[/cyan] | stale {task.fields[stale]} | ETA {task.fields[eta]}"
            ),
            TimeElapsedColumn(),
            console=self.console,
            refresh_per_second=2,
        )
        self._task = progress.add_task("train", total=self.total_steps, reward="-", stale="-", eta="-")
        progress.start()
        return progress

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step == 0:  # not a training step: the initial model's eval/* (its evaluator prints a line)
            return
        now = time.perf_counter()
        seconds = metrics.get(TIMING_STEP, now - self._last)
        self._last = now
        self._step_seconds.append(seconds)
        self.console.print(self.format_line(step, metrics, seconds))
        if self.progress is not None:
            reward = metrics.get(REWARD_MEAN)
            self.progress.update(
                self._task,
                completed=step,
                eta=self._eta(step),
                reward="-" if reward is None else f"{reward:.3f}",
                stale=f"{metrics.get(STALENESS_MAX, 0):.0f}",
            )
            self.progress.refresh()

    def _eta(self, step: int) -> str:
        mean_seconds = sum(self._step_seconds) / max(len(self._step_seconds), 1)
        return _clock(mean_seconds * max(self.total_steps - step, 0))

    def format_line(self, step: int, metrics: dict[str, float], seconds: float) -> str:
        parts = [f"[bold]step {step}/{self.total_steps}[/bold]"]
        if REWARD_MEAN in metrics:
            std = metrics.get(REWARD_STD)
            parts.append(
                f"reward [cyan]{metrics[REWARD_MEAN]:.3f}[/cyan]" + (f" ±{std:.3f}" if std is not None else "")
            )
        if REWARD_PASS_RATE in metrics:
            parts.append(f"pass {metrics[REWARD_PASS_RATE]:.2f}")
        if metrics.get(POLICY_SKIPPED_GROUPS):
            parts.append(f"skipped {metrics[POLICY_SKIPPED_GROUPS]:.0f} flat groups")
        kl = next((k for k in KL_KEYS if k in metrics), None) or next((k for k in metrics if is_kl_key(k)), None)
        if kl is not None:
            parts.append(f"kl {metrics[kl]:.2e}")
        if STALENESS_MAX in metrics:
            parts.append(f"stale {metrics[STALENESS_MAX]:.0f}")
        parts.append(f"{seconds:.1f} s/step")
        parts.append(f"ETA {self._eta(step)}")
        return " | ".join(parts)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def _clock(seconds: float) -> str:
    """``75`` -> ``1:15``; ``3725`` -> ``1:02:05``."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


WANDB_ID_FILE = "wandb/run_id"
"""Where a run dir keeps its wandb run id (relative to the run dir)."""


def wandb_run_id(run_dir: Path) -> str:
    """The wandb run id of ``run_dir``: made on the first open and kept in ``WANDB_ID_FILE``, so every later
    open (``run.resume``, a trainer restart) continues the same wandb run instead of starting a new one."""
    path = run_dir / WANDB_ID_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # wandb's form
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(run_id + "\n")
    tmp.replace(path)  # atomic: a crash leaves no half-written id
    return run_id


class WandbSink:
    """wandb run writing under ``<run_dir>/wandb``; ``mode="offline"`` (default) needs no network or login.

    One run dir is one wandb run: its id lives in ``<run_dir>/wandb/run_id`` and every open passes it with
    ``resume="allow"``, so a resumed run's dashboard continues. Offline, each open writes its own
    ``offline-run-*-<id>`` folder; ``wandb sync <run_dir>/wandb/offline-run-*`` uploads them into that one run.

    ``wandb.init`` (its import and its service process) runs on a helper thread, so that the
    driver starts Ray meanwhile; ``ready()`` (the driver calls it before any actor starts, through
    ``MetricsLogger.ready``) waits for it and raises its error, and ``run`` waits too.
    """

    def __init__(
        self, run_dir: str | Path, project: str, mode: str = "offline", config_dict: dict[str, Any] | None = None
    ):
        if mode not in ("offline", "online"):
            raise ValueError(f"WandbSink mode={mode!r}; use offline or online (logging.wandb=disabled turns it off)")
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        pool = ThreadPoolExecutor(1, thread_name_prefix="wandb-init")
        # cast: checked just above (LoggingConfig.wandb is a plain str until the config takes Literal types)
        checked = cast(Literal["offline", "online"], mode)
        self._init = pool.submit(_wandb_init, run_dir, project, checked, config_dict or {})
        pool.shutdown(wait=False)  # the thread ends with wandb.init; nothing else runs on it

    @property
    def run(self) -> Any:
        return self._init.result()

    def ready(self) -> None:
        self._init.result()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({k: _scalar(v) for k, v in metrics.items()}, step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        columns = list(dict.fromkeys(k for row in rows for k in row))
        data = [[_json_value(row.get(k)) for k in columns] for row in rows]
        import wandb

        self.run.log({"samples": wandb.Table(columns=list(columns), data=data)}, step=step)

    def close(self) -> None:
        """Finish the run and wait until its records are on disk: in wandb 0.31 ``finish`` returns before
        an offline run's ``.wandb`` log is written (seen: 7 bytes, then 2 KB once the service exited), so
        the service is torn down here; the next ``wandb.init`` starts a new one."""
        import wandb

        if self._init.exception() is not None:  # never started (ready() raised it): nothing to finish
            return
        self.run.finish()
        wandb.teardown()


def _wandb_init(run_dir: Path, project: str, mode: Literal["offline", "online"], config_dict: dict[str, Any]) -> Any:
    import wandb

    return wandb.init(
        project=project,
        mode=mode,
        dir=str(run_dir),
        name=run_dir.name,
        id=wandb_run_id(run_dir),
        resume="allow",
        config=config_dict,
        reinit="create_new",
        settings=wandb.Settings(silent=True, console="off"),
    )


class MetricsLogger:
    """Fans ``log``/``log_samples``/``close`` out to its sinks and keeps the logged history."""

    def __init__(self, sinks: list[Sink] | None = None):
        self.sinks = list(sinks) if sinks else [NoopSink()]
        self.records: list[tuple[int, dict[str, Any]]] = []
        self._closed = False

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {k: _scalar(v) for k, v in metrics.items()}
        self.records.append((step, clean))
        for sink in self.sinks:
            sink.log(step, clean)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        for sink in self.sinks:
            sink.log_samples(step, rows)

    def ready(self) -> None:
        """Wait for sinks that start in the background (``WandbSink``) and raise their start-up error."""
        for sink in self.sinks:
            if hasattr(sink, "ready"):
                sink.ready()

    def history(self, key: str) -> list[float]:
        """Values of ``key`` in logging order (steps without it are skipped)."""
        return [m[key] for _, m in self.records if key in m]

    def close(self) -> None:
        """Close every sink once (a second call does nothing)."""
        if not self._closed:
            self._closed = True
            for sink in self.sinks:
                sink.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def make_logger(
    logging_cfg: LoggingConfig, run_dir: str | Path, config_dict: dict[str, Any], total_steps: int
) -> MetricsLogger:
    """Always ``metrics.jsonl``; the console line if ``logging.console``; wandb unless ``logging.wandb=disabled``."""
    sinks: list[Sink] = [JsonlSink(run_dir)]
    if logging_cfg.console:
        sinks.append(ConsoleSink(total_steps))
    if logging_cfg.wandb != "disabled":
        sinks.append(WandbSink(run_dir, logging_cfg.project, logging_cfg.wandb, config_dict))
    return MetricsLogger(sinks)
