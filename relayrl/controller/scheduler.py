"""The training loop of both modes: the ``ray.wait`` loop and the actor calls around ``StepPolicy``.

Every decision (admission, buffer, retries, counts) is ``controller/policy.py``'s; this file only
starts calls, waits for them and hands their results to the policy.

::

    replica r:  policy.launches ──generate(chunk)──▶ score ──▶ policy.on_scored(entry)   several in flight
    trainer:    policy.take_step ──train_step(v)──▶ sync(v+1) ──▶ log ──▶ policy.on_trained   one at a time
                       ▲                                  │
                       └── v = steps done; admission: started + chunk <= (v + k + 1) * B

=============  ========================  ===================================  =============================
loop           consumes                  waits for                            unblocked by
=============  ========================  ===================================  =============================
rollout (×N)   prompts (sampler, retry   its generate ref, up to              a step trained (admission), a
               and pending chunks)       ``rollout.generate_timeout_s``       buffer take (capacity), a
                                                                              replica restarted
score (×N)     a finished generate ref   its ``Scored`` ref (the scorer       a generate ref ready
                                         actor; small fields come back)
trainer        the buffer's next entries  rank 0's train_step ref, then the   the buffer filled a step (in
               in start order            sync and the mismatch probe          start order); colocated: no
                                                                              chunk generating
=============  ========================  ===================================  =============================

``mode=async`` takes k = ``buffer.max_staleness``: replicas keep generating while the trainer trains,
and a sync lands in flight (the engine pauses, loads, resumes; unfinished completions go on under the
new weights, their version spans recording the switch). ``mode=sync`` is this same loop with k = 0,
which admits step v+1's prompts only after step v's weights are synced: strictly on-policy.
``rollout.pause_while_training`` pauses the engines (running sequences frozen, nothing lost) while a step
trains, so that on a small box both sides take turns on every core and, with ``rollout.stream``, the frozen
tail is carried over into a batch the next steps' groups keep full. ``placement=colocated`` time-shares the
bundles: never generating and training at once, engines asleep and the trainer on-loaded while it trains (on
CPU the switch is made but frees nothing).

Generate, score and train calls are all waited on in the one ``ray.wait``: scoring one chunk never holds
up a step that finished meanwhile. A replica's slot stays taken until its chunk is scored: one slot per
replica, or with ``rollout.stream`` one per group, twice as many as the engine runs (``max_num_seqs`` =
``rollout.in_flight``), so that vLLM's continuous batching starts a waiting sequence the moment one ends
and a group is scored and buffered the moment its last sequence ends. What a failed call
leads to (a replica replaced, ``GenerateError``, ``TrainerDied``) is tabled in ``controller/faults.py``;
the weight sync, its probe and the colocated hand-over are ``System``'s.

The driver holds refs and counters only; trajectories go rollout -> scorer -> buffer -> trainer as refs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from typing import Any

import ray

from relayrl.config import Config
from relayrl.controller.buffer import Entry
from relayrl.controller.faults import GenerateError, generation_error, task_error_line, trainer_result
from relayrl.controller.loop import Event, Loop
from relayrl.controller.membership import Membership
from relayrl.controller.policy import Flight, PolicyConfig, Step, StepPolicy
from relayrl.controller.replicas import is_death
from relayrl.controller.run import RunDir
from relayrl.controller.steplog import StepLog
from relayrl.controller.system import System
from relayrl.controller.training_eval import TrainingEval
from relayrl.data.sampler import Prompt
from relayrl.monitor.schema import (
    ROLLOUT_CALLS,
    ROLLOUT_REISSUED,
    ROLLOUT_REPLICAS,
    TIMING_GENERATE,
    TIMING_SCORE,
    TIMING_SYNC,
    TIMING_TRAIN,
)
from relayrl.rewards.scoring import Scored
from relayrl.rollout.occupancy import engine_memory, occupancy_metrics
from relayrl.weightsync.store import fetch_error

logger = logging.getLogger(__name__)

CONTROL_POLL_S = 2.0
"""The longest the loop waits on Ray before it looks at ``control/`` (``controller/membership.py``)."""


class Scheduler(Loop):
    """The ``ray.wait`` loop around one ``StepPolicy`` (the loop itself is ``controller/loop.py``'s): the
    policy holds the work in flight (its ``Flight`` records and ``Step``); this loop indexes the flights by the
    ref it waits on for each."""

    def __init__(self, cfg: Config, system: System, run: RunDir):
        self.cfg, self.system, self.run = cfg, system, run
        self.n = len(system.rollouts)
        self.colocated = cfg.placement.mode == "colocated"
        self.policy = StepPolicy(PolicyConfig.from_config(cfg, self.n), system.sampler.next_batch, system.sampler)
        self.generate_calls: dict[ray.ObjectRef, Flight] = {}  # generate ref -> the policy's flight
        self.score_calls: dict[ray.ObjectRef, Flight] = {}  # Scored ref -> the policy's flight
        self.idle = [r for _ in range(self.policy.pc.slots) for r in system.ids]  # free slots, by replica id
        self.idle_since = time.perf_counter()
        self.bad_steps = 0  # consecutive steps skipped for a NaN/inf gradient
        self.calls: Counter[int] = Counter()  # generate calls scored, per replica
        self.log = StepLog(cfg, run, self.n, getattr(system, "startup", {}), self.policy.pc.refill)
        self.evaluator = TrainingEval(cfg, system, run)  # eval.every: held-out prompts drawn once
        pc = self.policy.pc  # the sequences an engine is meant to run: rollout.occupancy's target
        self.target = cfg.rollout.in_flight if pc.stream else pc.chunk * cfg.algorithm.group_size
        self.members = Membership(self)  # replicas joining and leaving (``relayrl scale``)
        self.reissued = 0  # the policy's count when the last step was logged

    def restore(self, state: dict) -> None:
        """Continue after checkpoint ``state`` (``controller.checkpoint``): the trainer and engines already
        hold its weights; data continues from the saved cursor, unfinished chunks first."""
        self.policy.load_state_dict(state)

    def checkpoint(self) -> None:
        """Trainer shards + the driver's state at the current version (atomic, written in the background;
        see controller/checkpoint)."""
        checkpoints = self.run.checkpoints
        assert checkpoints is not None, "a RunDir made by RunDir.create or reopen has its Checkpointer"
        checkpoints.save(self.policy.version, self.system.trainer, self.policy.state_dict())

    def run_steps(self) -> None:
        if self.colocated and self.cfg.placement.offload_trainer:
            self.system.trainer.offload()  # rollout goes first: the trainer waits in host memory
        self.evaluator.before_first_step(self.policy.version)  # eval.before_first_step: step 0
        try:
            self.run_loop(self.cfg.run.steps)
        finally:
            self.members.shutdown()  # replicas still starting; the joined ones end with the system
        logger.info(self.policy.check_accounting())
        calls = ", ".join(f"{r}: {n}" for r, n in sorted(self.calls.items()))
        logger.info("relayrl: generate calls scored per replica: %s; %d copies lost", calls, self.policy.reissued)

    def _membership(self) -> None:
        """``relayrl scale`` and autoscale (the trainer is reconnected only while no step trains)."""
        self.members.update(quiet=self.policy.training is None)

    # ---- waiting ------------------------------------------------------------------------------------
    def _in_flight(self) -> bool:
        return bool(self.generate_calls or self.score_calls or self.policy.training)

    def _wait(self) -> tuple[Event, ray.ObjectRef | None]:
        step = self.policy.training
        refs = [*self.generate_calls, *self.score_calls, *(step.refs[:1] if step else [])]
        ready, _ = ray.wait(refs, num_returns=1, timeout=self._wait_s())
        if not ready:
            return "overdue", None
        if ready[0] in self.generate_calls:
            return "generated", ready[0]
        return ("scored", ready[0]) if ready[0] in self.score_calls else ("trained", None)

    # ---- rollout side ----------------------------------------------------------------------------
    def _submit(self, flight: Flight) -> None:
        flight.actor = self.system.replica(flight.replica)
        lazy = self.cfg.weightsync.pull_when == "admission"  # the replica fetches the version the call needs
        ref = generate_remote(self.cfg, flight.actor, flight.prompts, self.policy.version if lazy else 0)
        flight.t0 = time.perf_counter()
        self.generate_calls[ref] = flight

    def _wait_s(self) -> float | None:
        """How long ``ray.wait`` may block: until the oldest generate call's deadline, and at most
        ``CONTROL_POLL_S`` (a ``relayrl scale`` request, a joiner coming up, are noticed between waits)."""
        limit = self.cfg.rollout.generate_timeout_s
        if not limit or not self.generate_calls:
            return CONTROL_POLL_S
        oldest = min(f.t0 for f in self.generate_calls.values())
        return min(CONTROL_POLL_S, max(0.0, oldest + limit - time.perf_counter()))

    def _expire_overdue(self) -> None:
        """Generate calls past ``rollout.generate_timeout_s``: their replica is hung; treat it as dead."""
        limit, now = self.cfg.rollout.generate_timeout_s, time.perf_counter()
        for ref, flight in list(self.generate_calls.items()):
            if now - flight.t0 >= limit:
                del self.generate_calls[ref]
                error = TimeoutError(f"generate call {flight.seq} ran past rollout.generate_timeout_s={limit:g}")
                self._replace_replica(flight, error)

    def _now(self) -> float:
        return time.perf_counter()

    def _cancel(self, flight: Flight) -> None:
        """Cancel ``flight``'s generate call (the actor's coroutine gets ``CancelledError``; vLLM aborts its
        requests, freeing their KV cache); its result, if it still comes, is never looked at."""
        for ref, other in list(self.generate_calls.items()):
            if other is flight:
                del self.generate_calls[ref]
                with contextlib.suppress(Exception):  # a dead actor's call: nothing left to stop
                    ray.cancel(ref)

    def _is_current(self, flight: Flight) -> bool:
        return self.system.replica(flight.replica) is flight.actor

    def _restart(self, flight: Flight, error: BaseException | None) -> None:
        """Replace a dead replica in its bundle, or with ``rollout.autoscale`` (and another replica serving) let
        it leave and ask for a new one wherever Ray finds room (``Membership.lose``)."""
        assert error is not None, "a real replica is replaced for a reason"
        if self.members.autoscale and len(self.policy.replicas.serving()) > 1:
            self.members.lose(flight.replica)
            return
        self.system.restart_rollout(self.system.ids.index(flight.replica), self.policy.version, error)

    def _score(self, ref: ray.ObjectRef) -> None:
        """A generate call finished (or failed): hand its ref to the scorer; its ``Scored`` joins the wait."""
        flight = self.generate_calls.pop(ref)
        now = time.perf_counter()
        flight.generated, flight.generate_s, flight.score_t0 = ref, now - flight.t0, now
        self.policy.on_generated(flight, now)
        self.log.clock.generated(flight.replica, flight.t0, now)
        (flight.scored,), scored = self.system.score([ref])
        self.score_calls[scored] = flight

    def _finish_scoring(self, ref: ray.ObjectRef) -> None:
        flight = self.score_calls.pop(ref)
        if not self.policy.is_live(flight):  # its copy came back first: nothing to look at
            self.idle.append(flight.replica)
            return
        try:
            scored = self.system.rewards.result(ref)
        except Exception:
            if (error := generation_error(flight.generated)) is None:
                raise
            if not is_death(error, flight.actor):
                if (cause := fetch_error(error)) is not None:
                    self._cannot_fetch(flight, cause)
                    return
                raise GenerateError(task_error_line(flight.replica, error)) from None
            self._replace_replica(flight, error)
            return
        self.idle.append(flight.replica)
        self.calls[flight.replica] += 1
        scored.metrics |= {
            TIMING_SCORE: time.perf_counter() - flight.score_t0,
            TIMING_GENERATE: flight.generate_s,
            ROLLOUT_CALLS: 1.0,
        }
        self.policy.on_scored(scored_entry(flight, scored), flight)

    def _cannot_fetch(self, flight: Flight, error: BaseException) -> None:
        """``weightsync.pull_when=admission``: the replica could not fetch the version its call needed (store
        unreachable or damaged); it keeps its old weights, never generates with them, and leaves the run with its
        calls handed back, so the run goes on with the others. The last serving replica stops the run instead."""
        rid = flight.replica
        if self.policy.replicas.takes_work(rid) and len(self.members.serving) <= 1:
            raise GenerateError(task_error_line(rid, error)) from None
        self.policy.on_failed(flight.seq, flight, time.perf_counter())
        self.idle.append(rid)
        if self.policy.replicas.takes_work(rid):
            self.policy.retire(rid, hand_back=True)
            logger.warning("relayrl: rollout replica %d leaves: %s; %d serving", rid, error, len(self.members.serving))

    # ---- trainer side ----------------------------------------------------------------------------
    def _train(self, step: Step) -> None:
        self.log.clock.waited += time.perf_counter() - self.idle_since
        if self.colocated:
            self.log.clock.switches += 1
            self.system.to_trainer()
        elif self.cfg.rollout.pause_while_training:
            self.system.pause_rollouts()
        step.refs = self.system.trainer.train_step_async([e.ref for e in step.entries])
        step.t0 = time.perf_counter()

    def _finish_training(self) -> None:
        step = self.policy.training
        assert step is not None, "called once the step being trained has finished"
        entries, t0 = step.entries, step.t0
        try:
            train_stats = trainer_result(self.system.trainer, step.refs)
        finally:  # before the sync, which pauses the engines itself (and whose probe generates)
            if self.cfg.rollout.pause_while_training and not self.colocated:
                self.system.pause_rollouts(False)
        self._check_finite(train_stats)
        t1 = time.perf_counter()
        sync_stats, offloaded = self.system.sync_and_verify(self.policy.version + 1, [entries[0].ref])
        t2 = time.perf_counter()
        if self.colocated:
            self.log.clock.switches += 1
            self.log.clock.offloaded = offloaded
        self.log.clock.trainer_busy += t2 - t0
        self.idle_since = t2
        trained_at = self.policy.version
        self.log.prompts(trained_at + 1, self.policy.on_trained())
        replies = self.system.occupancy()
        self.log.replicas = len(self.policy.replicas.serving())
        reissued, self.reissued = self.policy.reissued - self.reissued, self.policy.reissued
        stats = {
            ROLLOUT_REPLICAS: float(self.log.replicas),
            ROLLOUT_REISSUED: float(reissued),
            **train_stats,
            **sync_stats,
            **self.policy.buffer.stats(),
            **occupancy_metrics(replies, self.target),
            **engine_memory(replies),
            **self.evaluator.after_step(self.policy.version),  # engines hold this version now
            TIMING_TRAIN: t1 - t0,
            TIMING_SYNC: t2 - t1,
        }
        self.log.write(
            trained_at,
            entries,
            stats,
            self.policy.counts,
            self.system.restarts,
            [(f.replica, f.t0) for f in self.generate_calls.values()],
        )
        every = self.cfg.run.checkpoint_every
        if every and self.policy.version % every == 0:
            self.checkpoint()

    def _check_finite(self, stats: dict) -> None:
        """A NaN/inf gradient makes the trainer skip its optimizer step; K such steps in a row stop the run."""
        self.bad_steps = self.bad_steps + 1 if stats.get("nonfinite_skips", 0) > 0 else 0
        if self.bad_steps >= self.cfg.trainer.max_bad_steps:
            raise RuntimeError(
                f"{self.bad_steps} steps in a row had a NaN/inf gradient and were skipped "
                "(trainer.max_bad_steps); lower trainer.lr or check the rewards for inf"
            )


def scored_entry(flight: Flight, scored: Scored) -> Entry:
    """The record the policy decides on, from the scorer's typed result for one call: the oldest and
    newest policy version among the chunk's tokens, its groups with reward spread (metrics: logs only);
    ``flight.scored`` is the ref of the scored groups."""
    return Entry(
        flight.seq,
        flight.scored,
        flight.prompt_ids,
        scored.min_version,
        scored.max_version,
        scored.metrics,
        useful=scored.useful,
    )


def generate_remote(cfg: Config, rollout: Any, prompts: list[Prompt], min_version: int = 0) -> ray.ObjectRef:
    """One replica's generate call: G multi-turn episodes per prompt when ``env.name`` is set (against that
    environment, ``relayrl.rollout.episode``), else G single completions; the engine first fetches a version
    of at least ``min_version`` if it serves an older one (``weightsync.pull_when=admission``)."""
    G, env = cfg.algorithm.group_size, cfg.env
    if env.name:
        return rollout.generate_episodes.remote(
            prompts, G, env.name, env.max_turns, env.kwargs, env.episode_timeout_s, min_version
        )
    return rollout.generate.remote(prompts, G, min_version)
