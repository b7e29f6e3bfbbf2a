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

The devices (``relayrl.plan.fluid``), as fluid jobs whose speed changes only at events:

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

Replicas of different speeds, and replicas joining and leaving (a spot node reclaimed, one added), are
``relayrl.plan.swarm_events``: ``Simulator`` is its ``Elastic`` loop, and ``engines`` is indexed by replica id.

Not simulated yet: generate timeouts (``rollout.generate_timeout_s``), a trainer rank's death (restart from the
last checkpoint), evaluation during training, the mismatch probe; dynamic
sampling is driven by a given ``useful`` function rather than rewards.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from relayrl.controller.buffer import Entry, staleness_histogram
from relayrl.controller.loop import Event
from relayrl.controller.policy import Flight, PolicyConfig, Step, StepPolicy
from relayrl.data.sampler import Prompt
from relayrl.plan.cost_model import CostModel
from relayrl.plan.fluid import Job, seq_of
from relayrl.plan.records import Death, SimResult, Span, StepRecord, coverage
from relayrl.plan.swarm_events import Change, Elastic, Swarm, replica_seconds, replicas_in

__all__ = ["Death", "SimResult", "Simulator", "Span", "policy_config", "simulate", "simulate_config"]


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


class Simulator(Elastic):
    """One simulated run of ``steps`` steps; ``run()`` returns its ``SimResult``. See the module docstring.

    ``deaths``: engines that die, and when; ``useful``: with dynamic sampling (``pc.refill``), the groups of a
    scored call whose rewards vary; ``max_restarts``: ``rollout.max_restarts`` (None: no limit); ``swarm``: the
    replicas' speeds and joins and leaves (``relayrl.plan.swarm_events``)."""

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
        swarm: Swarm | None = None,
    ):
        swarm = swarm or Swarm()
        super().__init__(costs, swarm.speeds_of(pc.replicas), pc.colocated)
        self.pc, self.steps = pc, steps
        self.pause_while_training, self.checkpoint_every = pause_while_training, checkpoint_every
        self.useful, self.max_restarts = useful, max_restarts
        sampler = _Sampler(pc.chunk)
        self.policy = StepPolicy(pc, sampler.next_batch, sampler)  # the real one: every decision is its own
        self.idle = [r for _ in range(pc.slots) for r in range(pc.replicas)]  # free slots, as the scheduler lists
        self.generate_calls: list[Job] = []  # what the scheduler's dicts hold, in start order
        self.score_calls: list[Job] = []
        self.restarts = 0
        self.records: list[StepRecord] = []
        self.window_start = 0.0
        self.step_marks: tuple[float, float] = (0.0, 0.0)  # (taken, train start) of the step in training
        self.staleness: Counter[int] = Counter()
        self.trained_by: Counter[int] = Counter()  # groups trained, by the replica that generated them
        for death in deaths:
            self._push(Job("death", end=death.at, replica=death.replica))
        self._plan_changes(swarm.events)

    # ---- the scheduler's loop ----------------------------------------------------------------------------
    def run(self) -> SimResult:
        self.run_loop(self.steps)
        self.policy.check_accounting()
        return self._result()

    def _in_flight(self) -> bool:
        return bool(self.generate_calls or self.score_calls or self.train_job or self.members.pending)

    def _wait(self) -> tuple[Event, Job]:
        job = self._next_done()
        return {"generate": "generated", "score": "scored"}.get(job.kind, "trained"), job  # type: ignore[return-value]

    def _submit(self, flight: Flight) -> None:
        engine = self.engines[flight.replica]
        flight.actor, flight.t0 = engine.incarnation, self.now
        cost = self.costs.call(len(flight.prompts))
        job = Job("generate", flight=flight, replica=flight.replica, cost=cost)
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
        self.train_job, self.train_t = Job("train", fixed_left=work, started=self.now), self.now

    def _score(self, job: Job) -> None:
        """A generate call finished (or failed): its scoring call starts (a failed one fails at once)."""
        self.generate_calls.remove(job)
        flight = job.flight
        assert flight is not None
        flight.generated, flight.generate_s, flight.score_t0 = job, self.now - flight.t0, self.now
        self.policy.on_generated(flight, self.now)
        seconds = 0.0 if job.failed else self.costs.score_s(len(flight.prompts))
        score = Job("score", end=self.now + seconds, flight=flight, replica=job.replica, source=job)
        score.failed, score.started = job.failed, self.now
        flight.scored = score
        self.score_calls.append(score)
        self._push(score)

    def _finish_scoring(self, job: Job) -> None:
        self.score_calls.remove(job)
        flight, generated = job.flight, job.source
        assert flight is not None and generated is not None
        if job.failed:  # the scorer's result raises; generation_error finds the replica's death
            self._replace_replica(flight)
            self._remove_drained()
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
        self.policy.on_scored(entry, flight)
        self._remove_drained()

    def _now(self) -> float:
        return self.now

    def _cancel(self, flight: Flight) -> None:
        """A losing copy's call leaves its engine: its sequences stop taking batch slots."""
        for job in [j for j in self.generate_calls if j.flight is flight]:
            self.generate_calls.remove(job)
            engine = self.engines[job.replica]
            self._change(engine, functools.partial(self._drop, engine, job))

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
            self.trained_by[e.ref.replica] += e.num_groups
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
            )
        )
        self.window_start = self.now
        self._stepped(self.policy.version)
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
    def _next_done(self) -> Job:
        """The next call the driver sees finish: one that finished while it was blocked, else the earliest."""
        while True:
            while not self.ready:
                te, job = self._pop()
                self.now = te
                self._complete(job)
            job = self.ready.popleft()
            if isinstance(job, Change):
                self._apply_change(job)
            elif job.kind != "generate" or job in self.generate_calls:  # else a cancelled call's late end
                return job

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

    def _complete(self, job: Job) -> None:
        """``job`` finished now on its device; the driver will see it (a death is the engines' only)."""
        if isinstance(job, Change):
            job.done = True
            self.ready.append(job)
            return
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
            self.spans.append(Span(f"rollout/{job.replica}", "generate", job.started, self.now, seq_of(job)))
        elif job.kind == "score":
            job.done = True
            self.spans.append(Span("reward", "score", job.started or self.now, self.now, seq_of(job)))
        else:
            self._change_all(lambda: setattr(job, "done", True))
            self.spans.append(Span("trainer", "train", job.started or self.now, self.now, self.policy.version + 1))
        self.ready.append(job)

    def _result(self) -> SimResult:
        for r, engine in enumerate(self.engines):
            self._catch_up(engine)
            self.spans += [Span(f"rollout/{r}", "busy", a, b) for a, b in engine.busy]
            self.spans += [Span(f"rollout/{r}", "paused", a, b) for a, b in engine.paused]
        trainer = coverage([(s.start, s.end) for s in self.spans if s.lane == "trainer"])
        rollout = [coverage([(a, b) for a, b in e.busy]) for e in self.engines]
        for rec in self.records:
            rec.trainer_busy = trainer(rec.end) - trainer(rec.start)
            rec.rollout_busy = sum(busy(rec.end) - busy(rec.start) for busy in rollout)
            rec.replicas = replicas_in(self.engines, rec.start, rec.end)
        return SimResult(
            self.policy,
            self.records,
            sorted(self.spans, key=lambda s: (s.start, s.lane)),
            self.now,
            self.staleness,
            self.restarts,
            self.costs.completions_per_group,
            self.costs.tokens_per_completion,
            replica_seconds(self.engines, self.now),
            self.trained_by,
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
