"""The simulated devices (``relayrl.plan.simulate``) as fluid jobs whose speeds change only at events.

``Devices`` holds the engines, the trainer's job and the event heap. A change to what sets a speed (a call
joining a batch, a pause, a step starting) first brings the affected devices to the present at their old speed
(``_catch_up``), applies the change, then retimes their next events (``_retime_engine``, ``_retime_train``):
between events every running call progresses linearly, so the clock jumps from event to event."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from relayrl.controller.policy import Flight, StepPolicy
from relayrl.plan.cost_model import CallCost, CostModel
from relayrl.plan.records import Span, extend_span


@dataclass(eq=False)
class Job:
    """A call in flight: ``end`` is its completion time at the current speeds, ``token`` its live heap entry."""

    kind: str  # generate | score | train | death
    end: float = math.inf
    token: int = 0
    done: bool = False
    failed: bool = False
    flight: Flight | None = None
    replica: int = -1
    cost: CallCost | None = None
    fixed_left: float = 0.0  # generate: seconds before decode; train: seconds of work
    steps_left: float = 0.0
    released: int = 0  # generate: its cost's releases done
    started: float | None = None  # generate: when its engine began running it
    v0: int = 0
    v1: int = 0
    source: Job | None = None  # score: the generate call it scores

    @property
    def live(self) -> int:
        """generate: its sequences still in the engine's batch (all but those its releases so far freed)."""
        assert self.cost is not None
        return self.cost.seqs - sum(n for _, n in self.cost.releases[: self.released])


@dataclass
class Engine:
    """A replica's engine. Its running calls' progress is accounted up to ``t``: an engine is brought to the
    present (``Simulator._catch_up``) before anything that changes its batch or its speed."""

    version: int = 0
    incarnation: int = 0
    alive: bool = True
    t: float = 0.0
    seqs: int = 0  # sequences of its running calls still decoding
    queue: deque[Job] = field(default_factory=deque)
    running: list[Job] = field(default_factory=list)
    busy: list[list[float]] = field(default_factory=list)  # merged [start, end] spans running, not paused
    paused: list[list[float]] = field(default_factory=list)  # merged spans with calls frozen by a pause
    speed: float = 1.0  # relative to the cost model's: its calls' fixed seconds and decode steps take 1/speed
    up: list[float] = field(default_factory=lambda: [0.0, math.inf])  # [joined, left] (a restart stays up)


class Devices:
    """The engines of replicas at ``speeds`` (one each, in id order), the trainer and the heap of their next
    events. ``Simulator`` subclasses it and supplies ``_complete`` (what a finished job means to the driver) and
    the policy. ``engines`` is indexed by replica id and only grows (``swarm_events``)."""

    policy: StepPolicy

    def __init__(self, costs: CostModel, speeds: Sequence[float], colocated: bool):
        self.costs, self.colocated = costs, colocated
        self.engines = [Engine(speed=s) for s in speeds]
        self.train_job: Job | None = None  # fixed_left: seconds of work left at ``train_t``
        self.train_t = 0.0
        self.now = 0.0  # the driver's clock
        self.heap: list[tuple[float, int, int, Job]] = []
        self.order = itertools.count()
        self.ready: deque[Job] = deque()  # finished while the driver was blocked, noticed in this order
        self.paused = False
        self.generating = 0  # engines with running calls (the trainer's overlap slowdown)
        self.spans: list[Span] = []

    def _gen_speed(self) -> float:
        if self.paused:
            return 0.0
        if self._training() and not self.colocated:
            return 1.0 / self.costs.overlap_slowdown
        return 1.0

    def _engine_speed(self, engine: Engine) -> float:
        return self._gen_speed() * engine.speed

    def _training(self) -> bool:
        """The trainer is computing (its step may have finished before the driver noticed)."""
        return self.train_job is not None and not self.train_job.done

    def _train_speed(self) -> float:
        overlapped = self.generating and not self.paused and not self.colocated
        return 1.0 / self.costs.overlap_slowdown if overlapped else 1.0

    def _catch_up(self, engine: Engine) -> None:
        """Account ``engine``'s running calls from ``engine.t`` to now (its batch and speed held meanwhile)."""
        dt = self.now - engine.t
        if dt > 0 and engine.running:
            speed = self._engine_speed(engine)
            extend_span(engine.busy if speed > 0 else engine.paused, engine.t, self.now)
            step = self.costs.decode_step_s(min(self.costs.engine_seqs, engine.seqs))
            for job in engine.running:
                work = dt * speed
                use = min(work, job.fixed_left)
                job.fixed_left -= use
                if job.steps_left > 0 and work > use:
                    job.steps_left = max(0.0, job.steps_left - (work - use) / step) if step > 0 else 0.0
        engine.t = self.now

    def _catch_up_train(self) -> None:
        if self._training():
            assert self.train_job is not None
            self.train_job.fixed_left = max(
                0.0, self.train_job.fixed_left - (self.now - self.train_t) * self._train_speed()
            )
        self.train_t = self.now

    def _retime_engine(self, engine: Engine) -> None:
        """The engine's next event at the current speed: the earliest of its running calls' next releases and
        ends. Only that call holds a heap entry: the engine's calls run at one speed until its next event, so
        the others' entries would only be replaced there."""
        speed = self._engine_speed(engine)
        step = self.costs.decode_step_s(min(self.costs.engine_seqs, engine.seqs)) if engine.running else 0.0
        first, first_left = None, math.inf
        for job in engine.running:
            assert job.cost is not None
            steps = job.steps_left
            if job.released < len(job.cost.releases):
                steps = max(0.0, job.cost.releases[job.released][0] - (job.cost.steps - job.steps_left))
            left = job.fixed_left + steps * step
            if first is None or left < first_left:
                first, first_left = job, left
        for job in engine.running:
            if job is not first:
                self._retime(job, math.inf)
        if first is not None:
            self._retime(first, self.now + first_left / speed if speed > 0 else math.inf)

    def _retime_train(self) -> None:
        if self._training():
            assert self.train_job is not None
            self._retime(self.train_job, self.now + self.train_job.fixed_left / self._train_speed())

    def _change(self, engine: Engine, change: Callable[[], object]) -> None:
        """Apply ``change`` to one engine's calls: progress is accounted up to now first, then the engine admits
        what fits and its calls (and the trainer, whose speed may depend on it) are retimed."""
        self._catch_up(engine)
        self._catch_up_train()
        was_running = bool(engine.running)
        change()
        self._admit(engine)
        self.generating += bool(engine.running) - was_running
        self._retime_engine(engine)
        self._retime_train()

    def _change_all(self, change: Callable[[], object]) -> None:
        """Apply ``change`` to what sets every device's speed (a pause, a step starting or ending)."""
        for engine in self.engines:
            self._catch_up(engine)
        self._catch_up_train()
        change()
        for engine in self.engines:
            self._retime_engine(engine)
        self._retime_train()

    def _retime(self, job: Job, end: float) -> None:
        if end == job.end or (math.isfinite(end) and math.isclose(end, job.end, rel_tol=1e-12, abs_tol=1e-12)):
            return
        job.end = end
        if math.isfinite(end):
            self._push(job)
        else:
            job.token += 1  # void the old entry

    def _push(self, job: Job) -> None:
        job.token += 1
        heapq.heappush(self.heap, (job.end, next(self.order), job.token, job))

    def _peek(self) -> float:
        while self.heap and (self.heap[0][3].done or self.heap[0][2] != self.heap[0][3].token):
            heapq.heappop(self.heap)
        return self.heap[0][0] if self.heap else math.inf

    def _pop(self) -> tuple[float, Job]:
        if self._peek() == math.inf:
            raise RuntimeError(f"simulation stalled at v{self.policy.version}: no call can finish")
        te, _, _, job = heapq.heappop(self.heap)
        return te, job

    def _advance_call(self, engine: Engine, job: Job) -> None:
        """``job``'s event came: its next release (they all come before its end), else its end."""
        assert job.cost is not None
        if job.released < len(job.cost.releases):
            at, seqs = job.cost.releases[job.released]
            job.released += 1
            job.steps_left = job.cost.steps - at  # the event's own time: no drift from the fluid sums
            engine.seqs -= seqs
            return
        job.done, job.v1 = True, engine.version
        engine.running.remove(job)
        engine.seqs -= job.live

    def _admit(self, engine: Engine) -> None:
        """Start queued calls FIFO while their sequences fit the engine's batch (one always fits)."""
        while engine.queue:
            job = engine.queue[0]
            assert job.cost is not None
            if engine.running and engine.seqs + job.cost.seqs > self.costs.engine_seqs:
                break
            engine.queue.popleft()
            job.started, job.v0 = self.now, engine.version
            flight = job.flight
            if flight is not None and self.now > flight.t0:
                self.spans.append(Span(f"rollout/{job.replica}", "queued", flight.t0, self.now, flight.seq))
            engine.running.append(job)
            engine.seqs += job.cost.seqs

    def _drop(self, engine: Engine, job: Job) -> None:
        """``job`` leaves its engine unfinished (cancelled): its sequences free their batch slots."""
        job.done = True  # its heap entry is void
        if job in engine.queue:
            engine.queue.remove(job)
        elif job in engine.running:
            engine.running.remove(job)
            engine.seqs -= job.live

    def _die(self, engine: Engine, replica: int) -> None:
        if not engine.alive:
            return
        self._catch_up(engine)
        self._catch_up_train()
        self.generating -= bool(engine.running)
        engine.alive = False
        for job in [*engine.running, *engine.queue]:
            if job.started is not None:
                self.spans.append(Span(f"rollout/{replica}", "generate", job.started, self.now, seq_of(job)))
            self._fail(job)
        engine.running.clear()
        engine.queue.clear()
        engine.seqs = 0
        self._retime_train()

    def _fail(self, job: Job) -> None:
        job.failed = job.done = True
        self.ready.append(job)


def seq_of(job: Job) -> int:
    return job.flight.seq if job.flight is not None else -1
