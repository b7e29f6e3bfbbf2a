"""The training loop of both modes: rollout runs ahead of training by at most k policy versions.

::

    replica r:  admit? ──generate(chunk)──▶ score ──▶ buffer.put(seq)          several in flight
    trainer:    buffer.ready(B)? ──train_step(v)──▶ sync(v+1) ──▶ log(step)    one at a time
                       ▲                                  │
                       └── v = steps done; admission: started + chunk <= (v + k + 1) * B

``mode=async`` takes k = ``buffer.max_staleness``: replicas keep generating while the trainer trains,
and a sync lands in flight (the engine pauses, loads, resumes; unfinished completions go on under the
new weights, their version spans recording the switch). ``mode=sync`` is this same loop with k = 0,
which admits step v+1's prompts only after step v's weights are synced: strictly on-policy.
``placement=colocated`` time-shares the bundles: never generating and training at once, engines
asleep and the trainer on-loaded while it trains (on CPU the switch is made but frees nothing).

The driver holds refs and counters only; trajectories go rollout -> scorer -> buffer -> trainer as refs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from relayrl.config import Config
from relayrl.controller.buffer import Admission, Entry, ReplayBuffer, staleness_histogram
from relayrl.controller.system import generate_remote


class TrainerDied(RuntimeError):
    """A trainer rank's actor died; the driver restarts the system from the latest checkpoint."""


@dataclass
class Launch:
    seq: int
    replica: int
    prompt_ids: list[int]
    t0: float
    actor: Any = None        # the replica's actor when launched (it may be replaced meanwhile)


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
                "timing/wait": self.waited, "timing/step": wall}


class Scheduler:
    def __init__(self, cfg: Config, system: Any, run: Any):
        self.cfg, self.system, self.run = cfg, system, run
        self.k = cfg.buffer.max_staleness if cfg.mode == "async" else 0
        self.B = cfg.run.prompts_per_step
        self.n = len(system.rollouts)
        self.chunk = self.B // self.n
        self.colocated = cfg.placement.mode == "colocated"
        self.admission = Admission(self.k, self.B)
        self.buffer = ray.remote(ReplayBuffer).options(num_cpus=0).remote(
            self.k, cfg.buffer.capacity, cfg.buffer.drop_stale)
        self.version = 0
        self.generating: dict[ray.ObjectRef, Launch] = {}
        self.idle = list(range(self.n))
        self.training: tuple[list[ray.ObjectRef], list[Entry], float] | None = None
        self.clock = Clock()
        self.idle_since = time.perf_counter()
        self.outstanding: dict[int, list[dict]] = {}   # seq -> prompts started but not yet trained
        self.pending: list[list[dict]] = []             # chunks to generate again first (after a resume)
        self.counts = {"issued": 0, "trained": 0, "dropped": 0}
        self.dropped_before_resume = 0                  # restored drops: the buffer's own count restarts at 0
        self.retry: list[Launch] = []                   # chunks to generate again after their replica died
        self.bad_steps = 0                              # consecutive steps skipped for a NaN/inf gradient
        self.next_seq = 0                               # start order of the next generate call
        algo = cfg.algorithm
        self.refill = algo.dynamic_sampling             # DAPO: count groups with reward spread, draw more
        self.max_groups = algo.max_sampling_batches * self.B if self.refill and algo.max_sampling_batches else None

    def restore(self, state: dict) -> None:
        """Continue after checkpoint ``state`` (``controller.checkpoint``): the trainer and engines already
        hold its weights; data continues from the saved cursor, unfinished chunks first."""
        self.version = state["step"]
        self.system.sampler.load_state_dict(state["sampler"])
        self.pending = [list(c) for c in state["pending"]]
        self.admission.started = self.version * self.B
        self.next_seq = state.get("seq", self.version * self.n)   # checkpoints before refills: n calls per step
        ray.get(self.buffer.skip_to.remote(self.next_seq))
        self.counts = dict(state["counts"])
        self.counts["issued"] -= sum(len(c) for c in self.pending)   # counted again when re-issued
        self.dropped_before_resume = self.counts["dropped"]

    def run_steps(self) -> None:
        if self.colocated and self.cfg.placement.offload_trainer:
            self.system.trainer.offload()          # rollout goes first: the trainer waits in host memory
        while self.version < self.cfg.run.steps:
            self._admit()
            self._start_training()
            refs = list(self.generating) + (self.training[0][:1] if self.training else [])
            if not refs:
                raise RuntimeError(f"scheduler stalled at v{self.version}: nothing generating or training and "
                                   "the buffer cannot fill a step; check buffer.capacity and run.prompts_per_step")
            ready, _ = ray.wait(refs, num_returns=1)
            if ready[0] in self.generating:
                self._finish_generation(ready[0])
            else:
                self._finish_training()
        self._check_accounting()

    def _check_accounting(self) -> None:
        """issued == trained + dropped + still in flight (started after the last step was taken)."""
        in_flight = sum(len(p) for p in self.outstanding.values())
        c = self.counts
        if c["issued"] != c["trained"] + c["dropped"] + in_flight:
            raise RuntimeError(f"prompt accounting broke: issued {c['issued']} != trained {c['trained']} + "
                               f"dropped {c['dropped']} + in flight {in_flight}")
        print(f"prompts: issued {c['issued']} = trained {c['trained']} + dropped {c['dropped']} "
              f"+ in flight at the end {in_flight}")

    # ---- rollout side ----------------------------------------------------------------------------
    def _admit(self) -> None:
        """Start a chunk on every idle replica that admission control (and the buffer's room) allows."""
        if self.colocated and self.training:
            return
        while self.idle and self.retry:            # chunks whose replica died: same seq, already admitted
            old = self.retry.pop(0)
            replica = self.idle.pop(0)
            actor = self.system.rollouts[replica]
            ref = generate_remote(self.cfg, actor, self.outstanding[old.seq])
            self.generating[ref] = Launch(old.seq, replica, old.prompt_ids, time.perf_counter(), actor)
        while self.idle and self.admission.allows(self.version, self.chunk) and self._room():
            replica = self.idle.pop(0)
            prompts = self.pending.pop(0) if self.pending else self.system.sampler.next_batch()
            seq, self.next_seq = self.next_seq, self.next_seq + 1
            self.admission.start(self.chunk)
            self.outstanding[seq] = prompts
            self.counts["issued"] += len(prompts)
            actor = self.system.rollouts[replica]
            ref = generate_remote(self.cfg, actor, prompts)
            self.generating[ref] = Launch(seq, replica, [p["prompt_id"] for p in prompts], time.perf_counter(), actor)

    def _replace_replica(self, launch: Launch, error: BaseException) -> None:
        """A replica died mid-generation: start a new one (with the current weights) and generate its chunk
        again under the same sequence number, so data order and accounting are unchanged."""
        if self.system.rollouts[launch.replica] is launch.actor:    # not yet replaced (e.g. during a sync)
            self._restart(launch.replica, error, self.version)
        self.retry.append(launch)
        self.idle.append(launch.replica)

    def _restart(self, replica: int, error: BaseException, version: int) -> None:
        if self.system.restarts >= self.cfg.rollout.max_restarts:
            raise RuntimeError(f"rollout replica {replica} died again after {self.system.restarts} restarts "
                               f"(rollout.max_restarts): {str(error).strip().splitlines()[-1]}") from error
        print(f"relayrl: rollout replica {replica} died ({type(error).__name__}); restarting it")
        self.system.restart_rollout(replica, version)

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
                self._restart(i, exc, version=0)       # the retry below brings every engine to ``version``
            return self.system.sync_weights(version)

    def _room(self) -> bool:
        return self.cfg.buffer.capacity is None or ray.get(self.buffer.has_room.remote(self.chunk))

    def _finish_generation(self, ref: ray.ObjectRef) -> None:
        launch = self.generating.pop(ref)
        generate_s = time.perf_counter() - launch.t0
        self.clock.rollout_busy += time.perf_counter() - max(launch.t0, self.clock.start)
        t0 = time.perf_counter()
        try:
            (scored,), metrics = self.system.score([ref])
        except Exception:
            if (error := generation_error(ref)) is None:
                raise
            self._replace_replica(launch, error)
            return
        self.idle.append(launch.replica)
        metrics |= {"timing/score": time.perf_counter() - t0, "timing/generate": generate_s, "rollout/calls": 1.0}
        entry = Entry(launch.seq, scored, launch.prompt_ids, int(metrics["rollout/min_version"]),
                      int(metrics["rollout/max_version"]), metrics)
        if self.refill:                            # groups without reward spread don't count towards a step
            entry.useful = int(metrics.get("reward/spread_groups", 0))
            self.admission.waste(entry.num_groups - entry.useful)
        ray.get(self.buffer.put.remote(entry))

    # ---- trainer side ----------------------------------------------------------------------------
    def _start_training(self) -> None:
        if self.training or (self.colocated and self.generating):
            return
        if not ray.get(self.buffer.ready.remote(self.version, self.B, self.max_groups)):
            return
        entries = ray.get(self.buffer.take.remote(self.version, self.B, self.max_groups))
        if self.refill:
            self._took(entries)
        for seq in range(min(self.outstanding), max(e.seq for e in entries) + 1):   # incl. dropped-stale ones
            self.outstanding.pop(seq, None)
        self.clock.waited += time.perf_counter() - self.idle_since
        if self.colocated:
            self._to_trainer()
        refs = self.system.trainer.train_step_async([e.ref for e in entries])
        self.training = (refs, entries, time.perf_counter())

    def _took(self, entries: list[Entry]) -> None:
        useful, drawn = sum(e.counted for e in entries), sum(e.num_groups for e in entries)
        if useful < self.B:
            raise RuntimeError(
                f"dynamic sampling drew {drawn} groups for step {self.version + 1} and only {useful} of the "
                f"{self.B} needed had rewards that vary (algorithm.max_sampling_batches="
                f"{self.cfg.algorithm.max_sampling_batches}): the prompts are too easy or too hard for this model; "
                "filter the dataset or raise algorithm.max_sampling_batches (0: no limit)")
        self.admission.took(useful)

    def _finish_training(self) -> None:
        refs, entries, t0 = self.training
        train_stats = trainer_result(self.system.trainer, refs)
        self._check_finite(train_stats)
        t1 = time.perf_counter()
        sync_stats = self._sync_and_verify(self.version + 1, [entries[0].ref])
        t2 = time.perf_counter()
        self.clock.trainer_busy += t2 - t0
        self.training = None
        self.idle_since = t2
        buffer_stats = ray.get(self.buffer.stats.remote())
        self._account(entries, buffer_stats)
        self._log(entries, train_stats, {**sync_stats, **buffer_stats, "timing/train": t1 - t0, "timing/sync": t2 - t1})
        self.version += 1
        every = self.cfg.run.checkpoint_every
        if every and self.version % every == 0:
            self.checkpoint()

    def _check_finite(self, stats: dict) -> None:
        """A NaN/inf gradient makes the trainer skip its optimizer step; K such steps in a row stop the run."""
        self.bad_steps = self.bad_steps + 1 if stats.get("nonfinite_skips", 0) > 0 else 0
        if self.bad_steps >= self.cfg.trainer.max_bad_steps:
            raise RuntimeError(f"{self.bad_steps} steps in a row had a NaN/inf gradient and were skipped "
                               "(trainer.max_bad_steps); lower trainer.lr or check the rewards for inf")

    def _account(self, entries: list[Entry], buffer_stats: dict[str, float]) -> None:
        """Every issued prompt ends trained or dropped (buffer staleness drops); groups the trainer filtered
        out (dynamic sampling, reward exclusions) reached a step and count as trained, with their own
        metrics (``dapo/dropped_groups``, ``reward/dropped_groups``). The prompt log records the order."""
        trained = [p for e in entries for p in e.prompt_ids]
        self.counts["dropped"] = self.dropped_before_resume + int(
            sum(v for k, v in buffer_stats.items() if k.startswith("buffer/dropped/")))
        self.counts["trained"] += len(trained)
        with open(self.run.path / "prompts.jsonl", "a") as f:
            f.write(json.dumps({"step": self.version + 1, "prompt_ids": trained}) + "\n")

    def checkpoint(self) -> None:
        """Trainer shards + the driver's state at the current version (atomic, written in the background;
        see controller/checkpoint)."""
        state = {"sampler": self.system.sampler.state_dict(), "counts": self.counts,
                 "seq": min(self.outstanding, default=self.next_seq),
                 "pending": [self.outstanding[s] for s in sorted(self.outstanding)] + self.pending}
        self.run.checkpoints.save(self.version, self.system.trainer, state)

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

    def _log(self, entries: list[Entry], train_stats: dict, stats: dict) -> None:
        now = time.perf_counter()   # credit generations still running to the window that is closing
        self.clock.rollout_busy += sum(now - max(g.t0, self.clock.start) for g in self.generating.values())
        rows = [row for e in entries for row in e.metrics.get("_samples", [])]
        out = {**mean_metrics(entries), **train_stats, **stats,
               **staleness_histogram(entries, self.version), **self._refill_stats(entries),
               **self.clock.metrics(self.n), "colocated/switches": float(self.clock.switches),
               **({"colocated/offload_bytes": self.clock.offloaded} if self.colocated else {}),
               **{f"accounting/{k}": float(v) for k, v in self.counts.items()},
               "rollout/restarts": float(self.system.restarts),
               "_samples": rows[: self.cfg.logging.samples_per_step]}
        self.run.log(self.version + 1, out)
        self.clock = Clock()

    def _refill_stats(self, entries: list[Entry]) -> dict[str, float]:
        if not self.refill:
            return {}
        return {"dapo/drawn_groups": float(sum(e.num_groups for e in entries))}


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


SUMMED = ("rollout/completions", "rollout/tokens", "rollout/calls", "reward/errors", "reward/dropped_groups",
          "reward/spread_groups")
"""Per-call counts: a step's value is their sum (every other metric is a group-weighted mean)."""


def mean_metrics(entries: list[Entry]) -> dict[str, float]:
    """Per-call scorer metrics combined over the step's entries: counts summed, extremes of versions
    taken, the rest averaged weighted by groups (exact for means over equal-sized groups; for
    ``reward/std`` the mean of per-call stds)."""
    total = sum(e.num_groups for e in entries)
    keys = {k for e in entries for k, v in e.metrics.items() if isinstance(v, (int, float))}
    out = {k: (sum(e.metrics.get(k, 0.0) for e in entries) if k.startswith(SUMMED) else
               sum(e.metrics.get(k, 0.0) * e.num_groups for e in entries) / total) for k in keys}
    for k in ("rollout/min_version", "rollout/max_version"):   # extremes, not means
        pick = min if k.endswith("min_version") else max
        out[k] = float(pick(e.metrics[k] for e in entries))
    return out
