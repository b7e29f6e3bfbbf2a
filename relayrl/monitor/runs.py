"""``relayrl runs``: the run directories under a folder, with status and best reward.

Status comes from ``status.json``, which ``RunDir`` writes: ``running`` (with the driver's pid and host)
when the run starts, ``finished`` after the final checkpoint and plots, ``failed`` (with the error's first
line) when ``train`` raises, ``interrupted`` after Ctrl-C. A ``running`` run whose process is gone from this
host died without saying so (killed, out of memory): it is shown as ``failed``. Runs without the file (older runs) are
``finished`` when metrics.jsonl reached ``run.steps`` and ``unknown`` otherwise.
"""

from __future__ import annotations

import json
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayrl.monitor.schema import REWARD_MEAN


@dataclass
class RunInfo:
    path: Path
    status: str  # finished | running | failed | interrupted | unknown
    steps_done: int
    steps_total: int | None
    best_reward: float | None
    best_step: int | None
    last_reward: float | None
    started: float  # config.yaml's mtime (seconds since the epoch)
    error: str = ""


def read_jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(line, record)`` of each line of a jsonl file ([] without the file). A writer killed mid-line
    (SIGKILL, power loss) leaves a torn last line: it is dropped. An unreadable line before the last is
    not a torn write but a damaged file: ValueError naming the file and the line."""
    lines = [x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()] if path.is_file() else []
    out = []
    for i, line in enumerate(lines, 1):
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError:
            if i < len(lines):
                raise ValueError(
                    f"{path}: line {i} is not JSON (only a torn last line is tolerated); repair or delete that line"
                ) from None
    return out


def is_live(run_dir: Path) -> bool:
    """Whether another driver on this host is still writing ``run_dir``: status.json says running and its
    pid is alive (a run on another host cannot be checked from here and counts as not live)."""
    try:
        record = json.loads((Path(run_dir) / "status.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    pid = record.get("pid", -1)
    return (
        record.get("status") == "running"
        and record.get("host") == socket.gethostname()
        and pid != os.getpid()
        and _pid_alive(pid)
    )


def read_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records ([] without the file); a half-written last line of a running run is skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _steps_total(run_dir: Path) -> int | None:
    import yaml

    try:
        return int(yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["steps"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return None


def _pid_alive(pid: int) -> bool:
    if not isinstance(pid, int) or pid <= 0:  # kill(-1, 0) or kill(0, 0) would ask about many processes
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def run_status(run_dir: Path, steps_done: int, steps_total: int | None) -> tuple[str, str]:
    """(status, error line) of one run directory; see the module docstring for the rules."""
    try:
        record = json.loads((run_dir / "status.json").read_text())
    except (OSError, json.JSONDecodeError):
        done = steps_total is not None and steps_done >= steps_total
        return ("finished" if done else "unknown"), ""
    status = record.get("status", "unknown")
    if status == "running" and record.get("host") == socket.gethostname() and not _pid_alive(record.get("pid", -1)):
        return "failed", f"driver process {record.get('pid')} exited without finishing (killed?)"
    return status, record.get("error", "")


def run_info(run_dir: str | Path) -> RunInfo:
    run_dir = Path(run_dir)
    records = read_records(run_dir)
    rewards = [
        (r["step"], r[REWARD_MEAN])
        for r in records
        if isinstance(r.get(REWARD_MEAN), (int, float)) and math.isfinite(r[REWARD_MEAN])
    ]
    best = max(rewards, key=lambda sr: sr[1], default=(None, None))
    total = _steps_total(run_dir)
    steps = sum(r.get("step", 0) > 0 for r in records)  # step 0: the initial model's eval (eval.every)
    status, error = run_status(run_dir, steps, total)
    started = (run_dir / "config.yaml").stat().st_mtime if (run_dir / "config.yaml").exists() else 0.0
    return RunInfo(run_dir, status, steps, total, best[1], best[0], rewards[-1][1] if rewards else None, started, error)


def scan_runs(root: str | Path) -> list[RunInfo]:
    """Every run directory directly under ``root`` (it has config.yaml or metrics.jsonl), oldest first."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory; pass the run.output_dir of your runs (default: runs)")
    dirs = [d for d in root.iterdir() if (d / "config.yaml").exists() or (d / "metrics.jsonl").exists()]
    return sorted((run_info(d) for d in dirs), key=lambda info: (info.started, info.path.name))


def runs_table(infos: list[RunInfo]) -> Any:
    """A rich Table: run, status, steps, best reward (at step), last reward, started, error."""
    import time

    from rich.table import Table

    table = Table("run", "status", "steps", "best reward", "last reward", "started", "error")
    style = {"finished": "green", "running": "cyan", "failed": "red", "interrupted": "magenta"}
    for info in infos:
        steps = f"{info.steps_done}/{info.steps_total if info.steps_total is not None else '?'}"
        best = "-" if info.best_reward is None else f"{info.best_reward:.3f} (step {info.best_step})"
        last = "-" if info.last_reward is None else f"{info.last_reward:.3f}"
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.started)) if info.started else "-"
        table.add_row(
            info.path.name, f"[{style.get(info.status, 'yellow')}]{info.status}", steps, best, last, started, info.error
        )
    return table
