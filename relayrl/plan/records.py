"""What a simulation returns (``relayrl.plan.simulate``): its steps, the spans each lane spent, and the
totals a planner reads (median step, throughput, idle fractions, staleness)."""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from relayrl.controller.policy import StepPolicy


@dataclass(frozen=True)
class Death:
    """Replica ``replica``'s engine dies at ``at`` seconds: every call on it fails (and any sent to it before the
    driver noticed); the driver replaces it as a real run does (``Loop._replace_replica``)."""

    at: float
    replica: int


@dataclass(frozen=True)
class Span:
    """Something a lane did from ``start`` to ``end``. Lanes: ``rollout/<r>`` (generate: a call from its start on
    the engine to its end, pauses included; queued: submitted, waiting for room in the batch; busy: some call
    running, merged; paused: calls frozen by a sync or ``pause_while_training``; restart), ``trainer`` (train,
    sync, switch, checkpoint), ``reward`` (score). ``label``: the call's seq or the step."""

    lane: str
    what: str
    start: float
    end: float
    label: int = -1


@dataclass
class StepRecord:
    """One step, as the StepLog windows it: from the previous step's ``on_trained`` (``start``) to its own
    (``end``). ``staleness`` is the StepLog's histogram of its entries; busy figures are inside the window."""

    step: int  # 1-based, as logged
    start: float
    taken: float  # take_step returned it
    train_start: float
    train_end: float  # the trainer finished computing
    sync_end: float  # on_trained
    seqs: list[int]
    groups: int
    staleness: dict[str, float]
    trainer_busy: float = 0.0  # train + sync + switch + checkpoint seconds inside the window
    rollout_busy: float = 0.0  # replica-seconds some call was running (not paused) on an engine
    replicas: float = 1  # rollout engines up over the window, on average (swarm_events.replicas_in)

    @property
    def end(self) -> float:
        return self.sync_end

    @property
    def step_s(self) -> float:
        return self.end - self.start

    @property
    def trainer_idle_s(self) -> float:
        return self.step_s - self.trainer_busy

    @property
    def rollout_idle_s(self) -> float:
        """Replica-seconds with nothing running (or paused) inside the window."""
        return self.replicas * self.step_s - self.rollout_busy


@dataclass
class SimResult:
    """A simulated run: the policy it drove (its counts, buffer and version as a real run leaves them), the
    per-step timeline, every span, and the staleness of every trained group."""

    policy: StepPolicy
    steps: list[StepRecord]
    spans: list[Span]
    wall_s: float
    staleness: Counter[int]  # groups trained d versions old (the sum of the steps' histograms)
    restarts: int
    completions_per_group: int
    tokens_per_completion: float
    replica_s: float  # replica-seconds the rollout pool had engines up (replicas x wall without joins or leaves)
    groups_by_replica: Counter[int]  # groups trained, by the replica that generated them (a copy's winner)

    def step_s(self, skip: int = 1) -> float:
        """Median step after ``skip`` warm-up steps (the planner's profile skips one as well)."""
        times = [s.step_s for s in self.steps[skip:]] or [s.step_s for s in self.steps]
        return statistics.median(times)

    def throughput(self) -> dict[str, float]:
        groups = sum(s.groups for s in self.steps)
        wall = max(self.wall_s, 1e-12)
        completions = groups * self.completions_per_group
        return {
            "groups_per_s": groups / wall,
            "completions_per_s": completions / wall,
            "tokens_per_s": completions * self.tokens_per_completion / wall,
        }

    def idle(self) -> dict[str, float]:
        """Idle fractions over the run: of the rollout pool's replica-seconds (an engine running no call, or
        paused) and of the trainer's seconds (not training, syncing, switching or saving)."""
        wall = max(self.wall_s, 1e-12)
        rollout = sum(s.end - s.start for s in self.spans if s.what == "busy")
        trainer = union_length([(s.start, s.end) for s in self.spans if s.lane == "trainer"])
        return {
            "idle/rollout": max(0.0, 1 - rollout / max(self.replica_s, 1e-12)),
            "idle/trainer": max(0.0, 1 - trainer / wall),
        }

    def lines(self) -> list[str]:
        """A readable summary: one line per step, then throughput, idle and staleness."""
        out = [f"{'step':>4} {'start':>9} {'train':>9} {'synced':>9} {'step_s':>8} {'idle tr':>8} {'idle ro':>8}"]
        out += [
            f"{s.step:>4} {s.start:>9.3f} {s.train_start:>9.3f} {s.end:>9.3f} {s.step_s:>8.3f} "
            f"{s.trainer_idle_s:>8.3f} {s.rollout_idle_s:>8.3f}"
            for s in self.steps
        ]
        tp = self.throughput()
        out.append(
            f"wall {self.wall_s:.3f}s, median step {self.step_s():.3f}s, {tp['completions_per_s']:.2f} completions/s, "
            f"{tp['tokens_per_s']:.1f} tokens/s, restarts {self.restarts}, reissued {self.policy.reissued}"
        )
        out.append(", ".join(f"{k} {v:.2f}" for k, v in self.idle().items()))
        out.append("staleness (groups): " + ", ".join(f"{d}: {n}" for d, n in sorted(self.staleness.items())))
        return out


def extend_span(spans: list[list[float]], a: float, b: float) -> None:
    if spans and spans[-1][1] >= a:
        spans[-1][1] = max(spans[-1][1], b)
    else:
        spans.append([a, b])


def coverage(spans: list[tuple[float, float]]) -> Callable[[float], float]:
    """F(t): how long the union of ``spans`` covers (-inf, t]; the busy time inside [a, b] is F(b) - F(a)."""
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    starts = [a for a, _ in merged]
    before = list(itertools.accumulate((b - a for a, b in merged), initial=0.0))

    def covered(t: float) -> float:
        i = bisect.bisect_right(starts, t)
        if i == 0:
            return 0.0
        a, b = merged[i - 1]
        return before[i - 1] + min(t, b) - a

    return covered


def union_length(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total
