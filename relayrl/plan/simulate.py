"""A discrete-event simulation of the training loop, driving the real ``StepPolicy`` with a simulated clock.

``controller/scheduler.py`` waits on Ray; this module replaces every Ray call by a cost (``relayrl.plan.costs``)
and the ``ray.wait`` by a min-heap of completion times, and calls the *same* ``StepPolicy`` object (imported,
not copied) with the same methods in the same order, so a simulated run makes the admission, staleness, buffer
and restart decisions a real run with those timings would. What it adds is the clock.

The loop is not written here: ``Simulator`` is a ``controller.loop.Loop``, the class ``Scheduler`` is too, and
runs its ``run_loop``. What this module supplies are the effects::

    _submit(flight)     the call joins its engine's queue
    _train(step)        colocated: hand over (switch_s); pause_while_training: pause the engines; the train call
    _wait()             the earliest completion (ties: the order their times were set)
    generate done  ->   _score: start its scoring call
        score done     ->   _finish_scoring: a failed call replaces its replica (restart_s, once per dead
                            engine: ``_restart``) and ``policy.on_failed``; else idle.append(replica),
                            ``policy.on_scored``
        train done     ->   _finish_training: resume paused engines, sync (engines paused for sync_s;
                            colocated: + the hand-back switch_s), ``policy.on_trained``, every
                            ``checkpoint_every`` steps a checkpoint stall; the driver's per-step
                            overhead (``costs.overhead_s``) blocks it after every step

Blocking calls of the scheduler (the sync, a hand-over, a replica's restart, a checkpoint save) block the
simulated driver too: work on the engines, the reward pool and the trainer goes on meanwhile, and what finishes is
noticed when the driver waits again, in completion order.

The devices, as fluid jobs whose speed changes only at events:

- a replica's engine runs calls FIFO while their sequences fit in ``costs.engine_seqs`` (one call always fits);
  a running call spends ``fixed_s`` (prefill) and then ``steps`` decode steps, each ``decode_step_s(b)`` long for
  the engine's batch b at that moment, so calls sharing an engine (``rollout.stream``) slow each other as
  continuous batching does. As its sequences end (``CallCost.releases``) they leave the batch: the rest decode
  faster and a queued call starts once its sequences fit. A sync pauses every engine (nothing is lost: the
  running calls go on after it, their newest version the new one); ``pause_while_training`` pauses them while a
  step trains.
- the trainer runs one step at a time. With separate placement and ``overlap_slowdown`` s > 1 (CPU boxes) both
  sides run s times slower while both compute.
- scoring calls run on the reward pool, all at once, ``score_s`` each.

An ``Entry``'s versions are the simulation's: the oldest is the engine's version when the call started running,
the newest its version when the call ended (engines take v+1 when a sync commits). The staleness histogram is the
StepLog's (``buffer.staleness_histogram`` of each step's entries at the version it trains at), and the buffer
raises ``StalenessError`` as in a real run if admission ever let one through.

Not simulated yet: generate timeouts (``rollout.generate_timeout_s``), a trainer rank's death (restart from the
last checkpoint), evaluation during training, the mismatch probe; dynamic
sampling is driven by a given ``useful`` function rather than rewards.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
import statistics
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from relayrl.controller.buffer import Entry, staleness_histogram
from relayrl.controller.loop import Event, Loop
from relayrl.controller.policy import Flight, PolicyConfig, Step, StepPolicy
from relayrl.data.sampler import Prompt
from relayrl.plan.costs import CallCost, CostModel

# ---- what a simulation returns -----------------------------------------------------------------------------


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
    replicas: int = 1

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
        replicas = self.policy.pc.replicas
        rollout = sum(s.end - s.start for s in self.spans if s.what == "busy")
        trainer = _union_length([(s.start, s.end) for s in self.spans if s.lane == "trainer"])
        return {
            "idle/rollout": max(0.0, 1 - rollout / (replicas * wall)),
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
            f"{tp['tokens_per_s']:.1f} tokens/s, restarts {self.restarts}"
        )
        out.append(", ".join(f"{k} {v:.2f}" for k, v in self.idle().items()))
        out.append("staleness (groups): " + ", ".join(f"{d}: {n}" for d, n in sorted(self.staleness.items())))
        return out


# ---- the simulated devices ---------------------------------------------------------------------------------


@dataclass(eq=False)
class _Job:
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
    source: _Job | None = None  # score: the generate call it scores

    @property
    def live(self) -> int:
        """generate: its sequences still in the engine's batch (all but those its releases so far freed)."""
        assert self.cost is not None
        return self.cost.seqs - sum(n for _, n in self.cost.releases[: self.released])


@dataclass
class _Engine:
    """A replica's engine. Its running calls' progress is accounted up to ``t``: an engine is brought to the
    present (``Simulator._catch_up``) before anything that changes its batch or its speed."""

    version: int = 0
    incarnation: int = 0
    alive: bool = True
    t: float = 0.0
    seqs: int = 0  # sequences of its running calls still decoding
    queue: deque[_Job] = field(default_factory=deque)
    running: list[_Job] = field(default_factory=list)
    busy: list[list[float]] = field(default_factory=list)  # merged [start, end] spans running, not paused
    paused: list[list[float]] = field(default_factory=list)  # merged spans with calls frozen by a pause


class _Sampler:
    """Prompts numbered in draw order (the start order), ``chunk`` at a time: the simulation needs no text."""

    def __init__(self, chunk: int):
        self.chunk, self.next = chunk, 0

    def next_batch(self) -> list[Prompt]:
        out = [Prompt(i, "") for i in range(self.next, self.next + self.chunk)]
        self.next += self.chunk
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next = state["next"]


class Simulator(Loop):
    """One simulated run of ``steps`` steps; ``run()`` returns its ``SimResult``. See the module docstring.

    ``deaths``: engines that die, and when; ``useful``: with dynamic sampling (``pc.refill``), the groups of a
    scored call whose rewards vary; ``max_restarts``: ``rollout.max_restarts`` (None: no limit)."""

    def __init__(
        self,
        pc: PolicyConfig,
        costs: CostModel,
        steps: int,
        *,
        pause_while_training: bool = False,
        checkpoint_every: int = 0,
        deaths: Iterable[Death] = (),
        useful: Callable[[Flight], int] | None = None,
        max_restarts: int | None = None,
    ):
        self.pc, self.costs, self.steps = pc, costs, steps
        self.pause_while_training, self.checkpoint_every = pause_while_training, checkpoint_every
        self.useful, self.max_restarts = useful, max_restarts
        sampler = _Sampler(pc.chunk)
        self.policy = StepPolicy(pc, sampler.next_batch, sampler)  # the real one: every decision is its own
        self.colocated = pc.colocated
        self.n = pc.replicas
        self.idle = [r for _ in range(pc.slots) for r in range(self.n)]  # free slots, as the scheduler lists them
        self.engines = [_Engine() for _ in range(self.n)]
        self.generate_calls: list[_Job] = []  # what the scheduler's dicts hold, in start order
        self.score_calls: list[_Job] = []
        self.train_job: _Job | None = None  # fixed_left: seconds of work left at ``train_t``
        self.train_t = 0.0
        self.now = 0.0  # the driver's clock
        self.heap: list[tuple[float, int, int, _Job]] = []
        self.order = itertools.count()
        self.ready: deque[_Job] = deque()  # finished while the driver was blocked, noticed in this order
        self.paused = False
        self.generating = 0  # engines with running calls (the trainer's overlap slowdown)
        self.restarts = 0
        self.spans: list[Span] = []
        self.records: list[StepRecord] = []
        self.window_start = 0.0
        self.step_marks: tuple[float, float] = (0.0, 0.0)  # (taken, train start) of the step in training
        self.staleness: Counter[int] = Counter()
        for death in deaths:
            self._push(_Job("death", end=death.at, replica=death.replica))

    # ---- the scheduler's loop ----------------------------------------------------------------------------
    def run(self) -> SimResult:
        self.run_loop(self.steps)
        self.policy.check_accounting()
        return self._result()

    def _in_flight(self) -> bool:
        return bool(self.generate_calls or self.score_calls or self.train_job)

    def _wait(self) -> tuple[Event, _Job]:
        job = self._next_done()
        return {"generate": "generated", "score": "scored"}.get(job.kind, "trained"), job  # type: ignore[return-value]

    def _submit(self, flight: Flight) -> None:
        engine = self.engines[flight.replica]
        flight.actor, flight.t0 = engine.incarnation, self.now
        cost = self.costs.call(len(flight.prompts))
        job = _Job("generate", flight=flight, replica=flight.replica, cost=cost)
        job.fixed_left, job.steps_left = cost.fixed_s, cost.steps
        self.generate_calls.append(job)
        if engine.alive:
            self._change(engine, functools.partial(engine.queue.append, job))
        else:  # sent to a dead engine before the driver noticed: the call fails at once
            self._fail(job)

    def _train(self, step: Step) -> None:
        taken = self.now
        if self.colocated:
            self._block(self.costs.switch_s(), "switch")
        elif self.pause_while_training:
            self._change_all(self._pause)
        step.t0 = self.now
        self.step_marks = (taken, self.now)
        work = self.costs.train_s(sum(e.num_groups for e in step.entries))
        self._change_all(lambda: self._start_train_job(work))

    def _start_train_job(self, work: float) -> None:
        self.train_job, self.train_t = _Job("train", fixed_left=work, started=self.now), self.now

    def _score(self, job: _Job) -> None:
        """A generate call finished (or failed): its scoring call starts (a failed one fails at once)."""
        self.generate_calls.remove(job)
        flight = job.flight
        assert flight is not None
        flight.generated, flight.generate_s, flight.score_t0 = job, self.now - flight.t0, self.now
        seconds = 0.0 if job.failed else self.costs.score_s(len(flight.prompts))
        score = _Job("score", end=self.now + seconds, flight=flight, replica=job.replica, source=job)
        score.failed, score.started = job.failed, self.now
        flight.scored = score
        self.score_calls.append(score)
        self._push(score)

    def _finish_scoring(self, job: _Job) -> None:
        self.score_calls.remove(job)
        flight, generated = job.flight, job.source
        assert flight is not None and generated is not None
        if job.failed:  # the scorer's result raises; generation_error finds the replica's death
            self._replace_replica(flight)
            return
        self.idle.append(flight.replica)
        entry = Entry(
            flight.seq,
            job,
            flight.prompt_ids,
            generated.v0,
            generated.v1,
            {"timing/generate": flight.generate_s, "timing/score": self.now - flight.score_t0},
            created=self.now,
            useful=self.useful(flight) if self.useful is not None else None,
        )
        self.policy.on_scored(entry)

    def _is_current(self, flight: Flight) -> bool:
        return self.engines[flight.replica].incarnation == flight.actor

    def _restart(self, flight: Flight, error: BaseException | None) -> None:
        """A new engine, synced to the policy's version; the driver waits ``restart_s`` for it."""
        replica = flight.replica
        if self.max_restarts is not None and self.restarts >= self.max_restarts:
            raise RuntimeError(f"rollout replica {replica} died past rollout.max_restarts={self.max_restarts}")
        self.restarts += 1
        t0 = self.now
        self._block(self.costs.restart_s(), "")
        self.spans.append(Span(f"rollout/{replica}", "restart", t0, self.now, flight.seq))
        engine = self.engines[replica]
        engine.incarnation += 1
        engine.alive, engine.version, engine.t = True, self.policy.version, self.now

    def _finish_training(self) -> None:
        step, job = self.policy.training, self.train_job
        assert step is not None and job is not None
        self._change_all(self._end_train_job)
        if self.pause_while_training and not self.colocated:
            self._change_all(self._resume)
        if self.colocated:
            self._block(self.costs.switch_s(), "switch")
        else:  # the sync's start pauses every engine; its commit resumes them
            self._change_all(self._pause)
        self._block(self.costs.sync_s(), "sync", label=self.policy.version + 1)
        for engine in self.engines:
            if engine.alive:
                engine.version = self.policy.version + 1
        if not self.colocated:
            self._change_all(self._resume)
        trained_at, entries = self.policy.version, step.entries
        self.policy.on_trained()
        self.policy.check_accounting()
        for e in entries:
            self.staleness[trained_at - e.min_version] += e.num_groups
        taken, train_start = self.step_marks
        self.records.append(
            StepRecord(
                trained_at + 1,
                self.window_start,
                taken,
                train_start,
                job.end,
                self.now,
                [e.seq for e in entries],
                sum(e.num_groups for e in entries),
                staleness_histogram(entries, trained_at),  # what the StepLog writes for the step
                replicas=self.n,
            )
        )
        self.window_start = self.now
        if overhead := self.costs.overhead_s():  # the driver's per-step work, inside the next step's window
            self._block(overhead, "")
        if self.checkpoint_every and self.policy.version % self.checkpoint_every == 0:
            self._block(self.costs.checkpoint_s(), "checkpoint", label=self.policy.version)

    def _end_train_job(self) -> None:
        self.train_job = None

    def _pause(self) -> None:
        self.paused = True

    def _resume(self) -> None:
        self.paused = False

    # ---- waiting and blocking --------------------------------------------------------------------------------
    def _next_done(self) -> _Job:
        """The next call the driver sees finish: one that finished while it was blocked, else the earliest."""
        while not self.ready:
            te, job = self._pop()
            self.now = te
            self._complete(job)
        return self.ready.popleft()

    def _block(self, seconds: float, what: str, label: int = -1) -> None:
        """The driver is busy ``seconds`` (a blocking call): the devices go on, what finishes waits in ``ready``."""
        t0, until = self.now, self.now + seconds
        while self._peek() <= until:
            te, job = self._pop()
            self.now = te
            self._complete(job)
        self.now = until
        if what:
            self.spans.append(Span("trainer", what, t0, until, label))

    # ---- the fluid model: speeds change only at events ------------------------------------------------------
    def _gen_speed(self) -> float:
        if self.paused:
            return 0.0
        if self._training() and not self.colocated:
            return 1.0 / self.costs.overlap_slowdown
        return 1.0

    def _training(self) -> bool:
        """The trainer is computing (its step may have finished before the driver noticed)."""
        return self.train_job is not None and not self.train_job.done

    def _train_speed(self) -> float:
        overlapped = self.generating and not self.paused and not self.colocated
        return 1.0 / self.costs.overlap_slowdown if overlapped else 1.0

    def _catch_up(self, engine: _Engine) -> None:
        """Account ``engine``'s running calls from ``engine.t`` to now (its batch and speed held meanwhile)."""
        dt = self.now - engine.t
        if dt > 0 and engine.running:
            speed = self._gen_speed()
            _extend(engine.busy if speed > 0 else engine.paused, engine.t, self.now)
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

    def _retime_engine(self, engine: _Engine) -> None:
        """The engine's next event at the current speed: the earliest of its running calls' next releases and
        ends. Only that call holds a heap entry: the engine's calls run at one speed until its next event, so
        the others' entries would only be replaced there."""
        speed = self._gen_speed()
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

    def _change(self, engine: _Engine, change: Callable[[], object]) -> None:
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

    def _retime(self, job: _Job, end: float) -> None:
        if end == job.end or (math.isfinite(end) and math.isclose(end, job.end, rel_tol=1e-12, abs_tol=1e-12)):
            return
        job.end = end
        if math.isfinite(end):
            self._push(job)
        else:
            job.token += 1  # void the old entry

    def _push(self, job: _Job) -> None:
        job.token += 1
        heapq.heappush(self.heap, (job.end, next(self.order), job.token, job))

    def _peek(self) -> float:
        while self.heap and (self.heap[0][3].done or self.heap[0][2] != self.heap[0][3].token):
            heapq.heappop(self.heap)
        return self.heap[0][0] if self.heap else math.inf

    def _pop(self) -> tuple[float, _Job]:
        if self._peek() == math.inf:
            raise RuntimeError(f"simulation stalled at v{self.policy.version}: no call can finish")
        te, _, _, job = heapq.heappop(self.heap)
        return te, job

    def _complete(self, job: _Job) -> None:
        """``job`` finished now on its device; the driver will see it (a death is the engines' only)."""
        if job.kind == "death":
            job.done = True
            self._die(self.engines[job.replica], job.replica)
            return
        if job.kind == "generate":
            engine = self.engines[job.replica]
            self._change(engine, lambda: self._advance_call(engine, job))
            if not job.done:  # a wave of its sequences ended: their slots are free, the call goes on
                return
            assert job.started is not None
            self.spans.append(Span(f"rollout/{job.replica}", "generate", job.started, self.now, _seq(job)))
        elif job.kind == "score":
            job.done = True
            self.spans.append(Span("reward", "score", job.started or self.now, self.now, _seq(job)))
        else:
            self._change_all(lambda: setattr(job, "done", True))
            self.spans.append(Span("trainer", "train", job.started or self.now, self.now, self.policy.version + 1))
        self.ready.append(job)

    def _advance_call(self, engine: _Engine, job: _Job) -> None:
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

    def _admit(self, engine: _Engine) -> None:
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

    def _die(self, engine: _Engine, replica: int) -> None:
        if not engine.alive:
            return
        self._catch_up(engine)
        self._catch_up_train()
        self.generating -= bool(engine.running)
        engine.alive = False
        for job in [*engine.running, *engine.queue]:
            if job.started is not None:
                self.spans.append(Span(f"rollout/{replica}", "generate", job.started, self.now, _seq(job)))
            self._fail(job)
        engine.running.clear()
        engine.queue.clear()
        engine.seqs = 0
        self._retime_train()

    def _fail(self, job: _Job) -> None:
        job.failed = job.done = True
        self.ready.append(job)

    def _result(self) -> SimResult:
        for r, engine in enumerate(self.engines):
            self._catch_up(engine)
            self.spans += [Span(f"rollout/{r}", "busy", a, b) for a, b in engine.busy]
            self.spans += [Span(f"rollout/{r}", "paused", a, b) for a, b in engine.paused]
        trainer = _coverage([(s.start, s.end) for s in self.spans if s.lane == "trainer"])
        rollout = [_coverage([(a, b) for a, b in e.busy]) for e in self.engines]
        for rec in self.records:
            rec.trainer_busy = trainer(rec.end) - trainer(rec.start)
            rec.rollout_busy = sum(busy(rec.end) - busy(rec.start) for busy in rollout)
        return SimResult(
            self.policy,
            self.records,
            sorted(self.spans, key=lambda s: (s.start, s.lane)),
            self.now,
            self.staleness,
            self.restarts,
            self.costs.completions_per_group,
            self.costs.tokens_per_completion,
        )


# ---- entry points ------------------------------------------------------------------------------------------


def policy_config(
    replicas: int,
    prompts_per_step: int,
    mode: str = "sync",
    k: int = 1,
    colocated: bool = False,
    **kw: Any,
) -> PolicyConfig:
    """The ``PolicyConfig`` a run of that shape gets: ``mode=sync`` is k = 0 (as ``PolicyConfig.from_config``)."""
    if mode not in ("sync", "async"):
        raise ValueError(f"mode={mode!r}: sync | async")
    return PolicyConfig(k if mode == "async" else 0, prompts_per_step, replicas, colocated=colocated, **kw)


def simulate(pc: PolicyConfig, costs: CostModel, steps: int, **kw: Any) -> SimResult:
    """Simulate ``steps`` steps of a run whose policy is configured by ``pc`` (``Simulator``'s keywords)."""
    return Simulator(pc, costs, steps, **kw).run()


def simulate_config(cfg: Any, costs: CostModel, **kw: Any) -> SimResult:
    """Simulate a run config (``relayrl.config.Config``): its policy exactly as the scheduler builds it, its steps,
    ``rollout.pause_while_training`` and ``run.checkpoint_every``."""
    pc = PolicyConfig.from_config(cfg, cfg.rollout.num_replicas)
    kw = {
        "pause_while_training": cfg.rollout.pause_while_training,
        "checkpoint_every": cfg.run.checkpoint_every,
        "max_restarts": cfg.rollout.max_restarts,
        **kw,
    }
    return simulate(pc, costs, cfg.run.steps, **kw)


# ---- helpers -------------------------------------------------------------------------------------------------


def _seq(job: _Job) -> int:
    return job.flight.seq if job.flight is not None else -1


def _extend(spans: list[list[float]], a: float, b: float) -> None:
    if spans and spans[-1][1] >= a:
        spans[-1][1] = max(spans[-1][1], b)
    else:
        spans.append([a, b])


def _coverage(spans: list[tuple[float, float]]) -> Callable[[float], float]:
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


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total
