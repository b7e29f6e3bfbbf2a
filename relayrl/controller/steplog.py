"""One step's record: the busy clocks between two logged steps and the metrics the loop writes.

The scheduler hands over what a step produced (its entries, the trainer's and the sync's stats); this
module adds what is measured around it (idle fractions, wait, staleness, accounting, the start-up
figures once) and writes it through ``RunDir.log``. The scorer's per-call metrics are combined per step
by each metric's schema ``reduce``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from relayrl.config import Config
from relayrl.controller.buffer import Entry, staleness_histogram
from relayrl.controller.run import RunDir
from relayrl.monitor.schema import TIMING_STEP, TIMING_WAIT, reduction


@dataclass
class Clock:
    """Busy seconds of the replicas and the trainer since the last step was logged."""

    start: float = field(default_factory=time.perf_counter)
    rollout_busy: float = 0.0
    trainer_busy: float = 0.0
    waited: float = 0.0  # trainer idle for lack of data
    switches: int = 0  # colocated mode switches
    offloaded: float = 0.0  # bytes of trainer state moved at the last colocated switch

    covered: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # replica -> its busy spans

    def generated(self, replica: int, t0: float, t1: float) -> None:
        """A generate call ran on ``replica`` from ``t0`` to ``t1``: credit the part inside this window that no
        other call on the replica covered (streaming overlaps them). The replica's credited time is kept as
        disjoint spans, not only its end: a long call can cover a gap between two short ones that ended first."""
        t0 = max(t0, self.start)
        if t1 <= t0:
            return
        spans = self.covered.setdefault(replica, [])
        self.rollout_busy += (t1 - t0) - sum(max(0.0, min(t1, b) - max(t0, a)) for a, b in spans)
        touching = [(a, b) for a, b in spans if a <= t1 and b >= t0]
        merged = (min([t0] + [a for a, _ in touching]), max([t1] + [b for _, b in touching]))
        self.covered[replica] = [s for s in spans if s not in touching] + [merged]

    def metrics(self, replicas: int) -> dict[str, float]:
        wall = max(time.perf_counter() - self.start, 1e-9)
        return {
            "idle/rollout": max(0.0, 1.0 - self.rollout_busy / (replicas * wall)),
            "idle/trainer": max(0.0, 1.0 - self.trainer_busy / wall),
            TIMING_WAIT: self.waited,
            TIMING_STEP: wall,
        }


class StepLog:
    """Writes each step's metrics (``write``) and prompt ids (``prompts.jsonl``); owns the step's ``Clock``."""

    def __init__(self, cfg: Config, run: RunDir, replicas: int, startup: dict[str, float], refill: bool):
        self.cfg, self.run, self.replicas, self.refill = cfg, run, replicas, refill
        self.clock = Clock()
        self.loop_start = time.time()  # the system is up: startup/first_step_s counts from here
        self.startup = dict(startup)  # logged once, with the first step

    def prompts(self, step: int, prompt_ids: list[int]) -> None:
        with open(self.run.path / "prompts.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "prompt_ids": prompt_ids}) + "\n")

    def write(
        self,
        version: int,
        entries: list[Entry],
        stats: dict[str, Any],
        counts: dict[str, int],
        restarts: int,
        running_since: list[tuple[int, float]],
    ) -> None:
        """Step ``version + 1``'s metrics; ``version``: the weights it was trained at (staleness).
        ``running_since``: (replica, start time) of generate calls still running, credited to the closing
        window."""
        now = time.perf_counter()
        for replica, t0 in running_since:
            self.clock.generated(replica, t0, now)
        colocated = self.cfg.placement.mode == "colocated"
        rows = [row for e in entries for row in e.metrics.get("_samples", [])]
        out = {
            **mean_metrics(entries),
            **stats,
            **staleness_histogram(entries, version),
            **({"dapo/drawn_groups": float(sum(e.num_groups for e in entries))} if self.refill else {}),
            **self.clock.metrics(self.replicas),
            "colocated/switches": float(self.clock.switches),
            **({"colocated/offload_bytes": self.clock.offloaded} if colocated else {}),
            **{f"accounting/{k}": float(v) for k, v in counts.items()},
            "rollout/restarts": float(restarts),
            **self._startup_once(),
            "_samples": rows[: self.cfg.logging.samples_per_step],
        }
        self.run.log(version + 1, out)
        self.clock = Clock()

    def _startup_once(self) -> dict[str, float]:
        """The system's ``startup/*`` metrics and launch -> now, on the first step this process logs."""
        startup, self.startup = self.startup, {}
        if not startup:
            return {}
        return {
            **startup,
            "startup/first_step_s": time.time() - self.loop_start,
            "startup/to_first_step_s": seconds_since_launch(),
        }


def seconds_since_launch() -> float:
    """How long ago this process was launched: the start of ``startup/to_first_step_s``.

    Linux: the kernel's boot clock now, less the process's start in ticks after boot (``/proc/self/stat``
    field 22), both exact to a tick. ``psutil``'s ``create_time`` adds that start to ``/proc/stat``'s boot
    time, which the kernel gives in whole seconds, so an age taken from it reads long by the boot time's
    fraction (up to a second). Elsewhere: ``psutil``."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        boot_now = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, AttributeError):
        import psutil

        return time.time() - psutil.Process().create_time()
    return age_s(boot_now, int(stat.rsplit(")", 1)[1].split()[19]), os.sysconf("SC_CLK_TCK"))


def age_s(boot_now: float, start_ticks: int, ticks_per_s: int) -> float:
    """Seconds since a process started ``start_ticks`` clock ticks after boot, ``boot_now`` s after boot."""
    return boot_now - start_ticks / ticks_per_s


def mean_metrics(entries: list[Entry]) -> dict[str, float]:
    """Per-call scorer metrics combined over the step's entries by each metric's schema ``reduce``: counts
    summed, version extremes taken, the rest averaged weighted by groups (exact for means over equal-sized
    groups; for ``reward/std`` the mean of per-call stds)."""
    total = sum(e.num_groups for e in entries)
    keys = {k for e in entries for k, v in e.metrics.items() if isinstance(v, (int, float))}
    return {
        k: combine(reduction(k), [(e.metrics[k], e.num_groups) for e in entries if k in e.metrics], total) for k in keys
    }


def combine(how: str, values: list[tuple[float, int]], total_groups: int) -> float:
    """``[(value, groups)]`` of one metric over a step's calls -> the step's value."""
    if how == "sum":
        return float(sum(v for v, _ in values))
    if how in ("min", "max"):
        return float((min if how == "min" else max)(v for v, _ in values))
    return sum(v * g for v, g in values) / total_groups
