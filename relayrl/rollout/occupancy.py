"""How full an engine's batch is: the sequences vLLM's scheduler runs at each engine step.

A decode step on CPU reads every weight whatever the batch, so a step that runs 4 sequences where 32 fit
costs nearly what the full step costs: occupancy (mean running sequences over the target) is the share of
that work put to use. A chunk's batch empties through its tail (its short completions end, the longest
goes on alone); streaming (``rollout.stream``) refills it.

vLLM hands its ``SchedulerStats`` (``num_running_reqs``, ``num_waiting_reqs``) after every engine step to
the stat loggers the ``AsyncLLM`` was built with; ``Occupancy.logger`` is one. Each of a request's ``n``
samples is a request of its own in vLLM's scheduler, so these count sequences. Steps run only while
there is work: idle time is ``idle/rollout``'s, not this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relayrl.monitor.schema import MEMORY_ENGINE_GB


@dataclass
class Occupancy:
    """Sums over the engine steps since the last ``take``."""

    steps: int = 0
    running: int = 0
    waiting: int = 0

    def add(self, running: int, waiting: int) -> None:
        self.steps += 1
        self.running += running
        self.waiting += waiting

    def take(self) -> dict[str, float]:
        """``steps``, mean ``running`` and ``waiting`` sequences per engine step since the last call; resets."""
        n = max(self.steps, 1)
        out = {"steps": float(self.steps), "running": self.running / n, "waiting": self.waiting / n}
        self.steps = self.running = self.waiting = 0
        return out

    def logger(self) -> Any:
        """A vLLM per-engine stat logger factory that adds every step's counts here (imports vLLM)."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        occupancy = self

        class Recorder(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kwargs: Any) -> None:
                if scheduler_stats is not None:
                    occupancy.add(scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs)

            def log_engine_initialized(self) -> None:
                pass

        return Recorder


def occupancy_metrics(replies: list[dict[str, float]], target: int) -> dict[str, float]:
    """The step's ``rollout/*`` occupancy metrics from each replica's ``Occupancy.take``, weighted by the
    engine steps each ran; ``target``: the sequences a replica is meant to run."""
    steps = sum(r["steps"] for r in replies)
    running = sum(r["running"] * r["steps"] for r in replies) / max(steps, 1)  # no engine step: 0
    waiting = sum(r["waiting"] * r["steps"] for r in replies) / max(steps, 1)
    return {
        "rollout/running": running,
        "rollout/waiting": waiting,
        "rollout/occupancy": running / max(target, 1),
        "rollout/engine_steps": steps,
    }


def process_tree_gb(pid: int | None = None) -> float:
    """Resident memory now, in GB (1e9 bytes), of actor process ``pid`` and its engines
    (``cleanup.actor_processes``: below it, or forked by the driver's server and registered under it). The
    default is this process's actor: the one it was forked for (``OWNER_ENV``: the engine host is itself
    forked by the server, beside its engine core and worker), else this process. A process that ends
    mid-count is skipped."""
    import os

    import psutil

    from relayrl.rollout.cleanup import actor_processes
    from relayrl.rollout.forkserver import OWNER_ENV

    if pid is None:
        pid = int(os.environ.get(OWNER_ENV) or os.getpid())
    total = 0
    for proc in actor_processes(pid):
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total / 1e9


def engine_memory_gb(cuda: bool) -> float:
    """What a replica holds now, in GB: on CUDA the memory in use on its device (vLLM's engine core runs in
    another process, so this process's allocator would miss it; colocated, the trainer's share counts too),
    else ``process_tree_gb``."""
    if cuda:
        import torch

        free, total = torch.cuda.mem_get_info()
        return (total - free) / 1e9
    return process_tree_gb()


def engine_memory(replies: list[dict[str, float]]) -> dict[str, float]:
    """``memory/engine_gb``: the largest ``memory_gb`` any replica reported (0 when none answered)."""
    return {MEMORY_ENGINE_GB: max((r.get("memory_gb", 0.0) for r in replies), default=0.0)}
