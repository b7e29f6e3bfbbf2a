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
score          a finished generate ref   the scorer (called inline: small     a generate ref ready
                                         metrics come back)
trainer        the buffer's next entries  rank 0's train_step ref, then the   the buffer filled a step (in
               in start order            sync and the mismatch probe          start order); colocated: no
                                                                              chunk generating
=============  ========================  ===================================  =============================

``mode=async`` takes k = ``buffer.max_staleness``: replicas keep generating while the trainer trains,
and a sync lands in flight (the engine pauses, loads, resumes; unfinished completions go on under the
new weights, their version spans recording the switch). ``mode=sync`` is this same loop with k = 0,
which admits step v+1's prompts only after step v's weights are synced: strictly on-policy.
``placement=colocated`` time-shares the bundles: never generating and training at once, engines
asleep and the trainer on-loaded while it trains (on CPU the switch is made but frees nothing).

A replica whose actor or engine dies (or whose generate call passes its deadline) is replaced and its
chunk generated again under the same seq; a generate call that fails while its replica still answers
is a task error (an environment, a prompt) and stops the run with its cause.

The driver holds refs and counters only; trajectories go rollout -> scorer -> buffer -> trainer as refs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from relayrl.config import Config
from relayrl.controller.buffer import Entry, staleness_histogram
from relayrl.controller.evaluation import TrainingEval
from relayrl.controller.policy import Launch, PolicyConfig, StepPolicy
from relayrl.controller.system import generate_remote, is_death
from relayrl.monitor.schema import (ROLLOUT_CALLS, TIMING_GENERATE, TIMING_SCORE, TIMING_STEP, TIMING_SYNC, TIMING_TRAIN,
                                    TIMING_WAIT, reduction)
from relayrl.rewards.scoring import Scored


class TrainerDied(RuntimeError):
    """A trainer rank's actor died; the driver restarts the system from the latest checkpoint."""


class GenerateError(RuntimeError):
    """A generate call failed while its replica is alive: the task's own error, not worth a restart."""


@dataclass
class Flight:
    """A generate call in flight: the policy's launch, when it started, the actor it runs on (the
    replica's slot may get a new actor meanwhile)."""

    launch: Launch
    t0: float
    actor: Any


@dataclass
class Clock:
    """Busy seconds of the replicas and the trainer since the last step was logged."""

    start: float = field(default_factory=time.perf_counter)
    rollout_busy: float = 0.0
    trainer_busy: float = 0.0
    waited: float = 0.0          # trainer idle for lack of data
    switches: int = 0            # colocated mode switches
    offloaded: float = 0.0       # bytes of trainer state moved at the last colocated switch

    def metrics(self, replicas: int) -> dict[str, float]:
        wall = max(time.perf_counter() - self.start, 1e-9)
        return {"idle/rollout": max(0.0, 1.0 - self.rollout_busy / (replicas * wall)),
                "idle/trainer": max(0.0, 1.0 - self.trainer_busy / wall),
                TIMING_WAIT: self.waited, TIMING_STEP: wall}


class Scheduler:
    def __init__(self, cfg: Config, system: Any, run: Any):
        self.cfg, self.system, self.run = cfg, system, run
        self.n = len(system.rollouts)
        self.colocated = cfg.placement.mode == "colocated"
        self.policy = StepPolicy(PolicyConfig.from_config(cfg, self.n), system.sampler.next_batch, system.sampler)
        self.generating: dict[ray.ObjectRef, Flight] = {}
        self.idle = list(range(self.n))
        self.training: tuple[list[ray.ObjectRef], list[Entry], float] | None = None
        self.clock = Clock()
        self.idle_since = time.perf_counter()
        self.bad_steps = 0                              # consecutive steps skipped for a NaN/inf gradient
        self.calls = [0] * self.n                       # generate calls scored, per replica
        self.loop_start = time.time()                   # the system is up: startup/first_step_s counts from here
        self.startup = dict(getattr(system, "startup", {}))   # logged once, with the first step
        self.evaluator = TrainingEval(cfg, system, run)     # eval.every: held-out prompts drawn once

    def restore(self, state: dict) -> None:
        """Continue after checkpoint ``state`` (``controller.checkpoint``): the trainer and engines already
        hold its weights; data continues from the saved cursor, unfinished chunks first."""
        self.policy.load_state_dict(state)

    def checkpoint(self) -> None:
        """Trainer shards + the driver's state at the current version (atomic, written in the background;
        see controller/checkpoint)."""
        self.run.checkpoints.save(self.policy.version, self.system.trainer, self.policy.state_dict())

    def run_steps(self) -> None:
        if self.colocated and self.cfg.placement.offload_trainer:
            self.system.trainer.offload()          # rollout goes first: the trainer waits in host memory
        self.evaluator.before_first_step(self.policy.version)   # eval.before_first_step: step 0
        while self.policy.version < self.cfg.run.steps:
            self._launch()
            self._start_training()
            refs = list(self.generating) + (self.training[0][:1] if self.training else [])
            if not refs:
                raise RuntimeError(f"scheduler stalled at v{self.policy.version}: nothing generating or "
                                   "training and the buffer cannot fill a step; check buffer.capacity and "
                                   "run.prompts_per_step")
            ready, _ = ray.wait(refs, num_returns=1, timeout=self._wait_s())
            if not ready:
                self._expire_overdue()
            elif ready[0] in self.generating:
                self._finish_generation(ready[0])
            else:
                self._finish_training()
        print(self.policy.check_accounting())

    # ---- rollout side ----------------------------------------------------------------------------
    def _launch(self) -> None:
        """Start every chunk the policy allows on the idle replicas."""
        for launch in self.policy.launches(self.idle):
            self.idle.remove(launch.replica)
            actor = self.system.rollouts[launch.replica]
            ref = generate_remote(self.cfg, actor, launch.prompts)
            self.generating[ref] = Flight(launch, time.perf_counter(), actor)

    def _wait_s(self) -> float | None:
        """How long ``ray.wait`` may block: until the oldest generate call's deadline (None: no limit)."""
        limit = self.cfg.rollout.generate_timeout_s
        if not limit or not self.generating:
            return None
        oldest = min(f.t0 for f in self.generating.values())
        return max(0.0, oldest + limit - time.perf_counter())

    def _expire_overdue(self) -> None:
        """Generate calls past ``rollout.generate_timeout_s``: their replica is hung; treat it as dead."""
        limit, now = self.cfg.rollout.generate_timeout_s, time.perf_counter()
        for ref, flight in list(self.generating.items()):
            if now - flight.t0 >= limit:
                del self.generating[ref]
                error = TimeoutError(f"generate call {flight.launch.seq} ran past rollout.generate_timeout_s="
                                     f"{limit:g}")
                self._replace_replica(flight, error)

    def _replace_replica(self, flight: Flight, error: BaseException) -> None:
        """A replica died mid-generation: start a new one (with the current weights) and generate its chunk
        again under the same sequence number, so data order and accounting are unchanged."""
        replica = flight.launch.replica
        if self.system.rollouts[replica] is flight.actor:    # not yet replaced (e.g. during a sync)
            print(f"relayrl: rollout replica {replica} died ({type(error).__name__}); restarting it")
            self.system.restart_rollout(replica, self.policy.version, error)
        self.policy.on_failed(flight.launch.seq)
        self.idle.append(replica)

    def _sync(self, version: int) -> dict[str, float]:
        """Sync the weights; if it failed because an engine died, replace the dead ones and sync again."""
        try:
            return self.system.sync_weights(version)
        except Exception as exc:
            if died := self.system.trainer.dead_ranks():
                raise TrainerDied(f"trainer rank {died[0]} died during the sync of v{version}") from exc
            dead = self.system.dead_rollouts()
            if not dead:
                raise
            for i in dead:
                print(f"relayrl: rollout replica {i} died ({type(exc).__name__}); restarting it")
                self.system.restart_rollout(i, 0, exc)   # the retry below brings every engine to ``version``
            return self.system.sync_weights(version)

    def _finish_generation(self, ref: ray.ObjectRef) -> None:
        flight = self.generating.pop(ref)
        generate_s = time.perf_counter() - flight.t0
        self.clock.rollout_busy += time.perf_counter() - max(flight.t0, self.clock.start)
        t0 = time.perf_counter()
        try:
            (scored_ref,), scored = self.system.score([ref])
        except Exception:
            if (error := generation_error(ref)) is None:
                raise
            if not is_death(error, flight.actor):
                raise GenerateError(task_error_line(flight.launch.replica, error)) from None
            self._replace_replica(flight, error)
            return
        self.idle.append(flight.launch.replica)
        self.calls[flight.launch.replica] += 1
        scored.metrics |= {TIMING_SCORE: time.perf_counter() - t0, TIMING_GENERATE: generate_s, ROLLOUT_CALLS: 1.0}
        self.policy.on_scored(scored_entry(flight.launch, scored_ref, scored))

    # ---- trainer side ----------------------------------------------------------------------------
    def _start_training(self) -> None:
        if self.training or (entries := self.policy.take_step()) is None:
            return
        self.clock.waited += time.perf_counter() - self.idle_since
        if self.colocated:
            self._to_trainer()
        refs = self.system.trainer.train_step_async([e.ref for e in entries])
        self.training = (refs, entries, time.perf_counter())

    def _finish_training(self) -> None:
        refs, entries, t0 = self.training
        train_stats = trainer_result(self.system.trainer, refs)
        self._check_finite(train_stats)
        t1 = time.perf_counter()
        sync_stats = self._sync_and_verify(self.policy.version + 1, [entries[0].ref])
        t2 = time.perf_counter()
        self.clock.trainer_busy += t2 - t0
        self.training = None
        self.idle_since = t2
        trained_at = self.policy.version
        trained = self.policy.on_trained()
        with open(self.run.path / "prompts.jsonl", "a") as f:
            f.write(json.dumps({"step": self.policy.version, "prompt_ids": trained}) + "\n")
        buffer_stats = self.policy.buffer.stats()
        evaluated = self.evaluator.after_step(self.policy.version)   # engines hold this version now
        self._log(entries, trained_at, train_stats,
                  {**sync_stats, **buffer_stats, **evaluated, TIMING_TRAIN: t1 - t0, TIMING_SYNC: t2 - t1})
        every = self.cfg.run.checkpoint_every
        if every and self.policy.version % every == 0:
            self.checkpoint()

    def _check_finite(self, stats: dict) -> None:
        """A NaN/inf gradient makes the trainer skip its optimizer step; K such steps in a row stop the run."""
        self.bad_steps = self.bad_steps + 1 if stats.get("nonfinite_skips", 0) > 0 else 0
        if self.bad_steps >= self.cfg.trainer.max_bad_steps:
            raise RuntimeError(f"{self.bad_steps} steps in a row had a NaN/inf gradient and were skipped "
                               "(trainer.max_bad_steps); lower trainer.lr or check the rewards for inf")

    def _sync_and_verify(self, version: int, refs: list) -> dict[str, float]:
        """Weights to the engines, then the mismatch probe. Colocated, this is also the hand-over back to
        rollout, ordered so the trainer's GPU memory is free before the engines' KV cache returns: engine
        weights wake -> sync -> the trainer's half of the probe -> trainer state to host -> KV cache wakes
        -> the engines' half of the probe."""
        if not self.colocated:
            return self._sync(version) | self.system.verify_sync(version, refs)
        ray.get([r.wake_up.remote(["weights"]) for r in self.system.rollouts])
        stats = self._sync(version)
        probe = self.system.mismatch_probe(version, refs)
        self.clock.offloaded = self.system.trainer.offload() if self.cfg.placement.offload_trainer else 0.0
        ray.get([r.wake_up.remote(["kv_cache"]) for r in self.system.rollouts])
        self.clock.switches += 1
        return stats | self.system.check_mismatch(version, probe)

    def _to_trainer(self) -> None:
        """Colocated: hand the bundles to the trainer: engines sleep (weights to host, KV cache dropped),
        then the trainer's state comes back onto the GPUs. On CPU neither frees anything."""
        self.clock.switches += 1
        ray.get([r.sleep.remote() for r in self.system.rollouts])
        if self.cfg.placement.offload_trainer:
            self.system.trainer.onload()

    def _log(self, entries: list[Entry], version: int, train_stats: dict, stats: dict) -> None:
        """Step ``version + 1``'s metrics; ``version``: the weights it was trained at (staleness)."""
        now = time.perf_counter()   # credit generations still running to the window that is closing
        self.clock.rollout_busy += sum(now - max(g.t0, self.clock.start) for g in self.generating.values())
        rows = [row for e in entries for row in e.metrics.get("_samples", [])]
        out = {**mean_metrics(entries), **train_stats, **stats,
               **staleness_histogram(entries, version), **self._refill_stats(entries),
               **self.clock.metrics(self.n), "colocated/switches": float(self.clock.switches),
               **({"colocated/offload_bytes": self.clock.offloaded} if self.colocated else {}),
               **{f"accounting/{k}": float(v) for k, v in self.policy.counts.items()},
               "rollout/restarts": float(self.system.restarts), **self._startup_once(),
               "_samples": rows[: self.cfg.logging.samples_per_step]}
        self.run.log(version + 1, out)
        self.clock = Clock()

    def _startup_once(self) -> dict[str, float]:
        """The system's ``startup/*`` metrics and launch -> now, on the first step this process logs."""
        startup, self.startup = self.startup, {}
        if not startup:
            return {}
        now = time.time()
        return {**startup, "startup/first_step_s": now - self.loop_start,
                "startup/to_first_step_s": now - process_start_time()}

    def _refill_stats(self, entries: list[Entry]) -> dict[str, float]:
        if not self.policy.pc.refill:
            return {}
        return {"dapo/drawn_groups": float(sum(e.num_groups for e in entries))}


def process_start_time() -> float:
    """When this process was launched (Unix time): the start of ``startup/to_first_step_s``."""
    import psutil

    return psutil.Process().create_time()


def scored_entry(launch: Launch, ref: ray.ObjectRef, scored: Scored) -> Entry:
    """The record the policy decides on, from the scorer's typed result for one call: the oldest and
    newest policy version among the chunk's tokens, its groups with reward spread (metrics: logs only)."""
    return Entry(launch.seq, ref, launch.prompt_ids, scored.min_version, scored.max_version, scored.metrics,
                 useful=scored.useful)


def task_error_line(replica: int, error: BaseException) -> str:
    """One line for a generate call that failed on a live replica: the cause's type and first line."""
    cause = getattr(error, "cause", None) or error
    first = (str(cause).strip().splitlines() or [""])[0][:300]
    return (f"rollout replica {replica}: generate failed with {type(cause).__name__}: {first} (the replica "
            "is alive, so this is the task's own error - an environment or a prompt - not a restart)")


def trainer_result(trainer: Any, refs: list[ray.ObjectRef]) -> dict:
    """Rank 0's stats once every rank finished. If a rank fails, ``TrainerDied`` when some rank's process
    is gone (the survivors then fail in their collectives: gloo reports the closed peer), else the error."""
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready[0])
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
            if dead := trainer.dead_ranks():
                raise TrainerDied(f"trainer rank {dead[0]} died in a train step") from exc
            raise
    return ray.get(refs[0])


def generation_error(ref: ray.ObjectRef) -> BaseException | None:
    """After scoring ``ref`` failed: the error the generate call itself ended with (its actor or engine
    died), or None if generation was fine and the failure is the scorer's. Only called on that path, so
    a good result is never pulled into the driver."""
    from ray.exceptions import RayActorError, RayTaskError

    try:
        ray.get(ref, timeout=0)
    except (RayActorError, RayTaskError) as exc:
        return exc
    return None


def mean_metrics(entries: list[Entry]) -> dict[str, float]:
    """Per-call scorer metrics combined over the step's entries by each metric's schema ``reduce``: counts
    summed, version extremes taken, the rest averaged weighted by groups (exact for means over equal-sized
    groups; for ``reward/std`` the mean of per-call stds)."""
    total = sum(e.num_groups for e in entries)
    keys = {k for e in entries for k, v in e.metrics.items() if isinstance(v, (int, float))}
    return {k: combine(reduction(k), [(e.metrics[k], e.num_groups) for e in entries if k in e.metrics], total)
            for k in keys}


def combine(how: str, values: list[tuple[float, int]], total_groups: int) -> float:
    """``[(value, groups)]`` of one metric over a step's calls -> the step's value."""
    if how == "sum":
        return float(sum(v for v, _ in values))
    if how in ("min", "max"):
        return float((min if how == "min" else max)(v for v, _ in values))
    return sum(v * g for v, g in values) / total_groups
