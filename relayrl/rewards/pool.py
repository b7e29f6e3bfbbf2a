"""Reward scoring off the training loop: a scorer actor that fans calls out to a pool of worker processes.

::

    driver ──group refs──▶ RewardScorer (Ray actor, owns the pool) ──Call──▶ RewardWorker × num_workers
           ◀─scored refs + Scored──┘      timeouts: ray.kill + respawn   ◀─CallResult─┘ (async actor:
                                                                           async fns concurrent,
                                                                           sync fns on one thread)

Why processes: a reward that hangs (an infinite loop, a stuck request) can only be stopped by killing
the process it runs in; a thread would keep running. Each call gets ``timeout_s`` from the moment it is
sent to a ready worker; when it passes, that worker is killed (``ray.kill``) and replaced, its call's
completions are excluded as ``timeout``, and other calls it was running are sent again once (a second
loss counts as ``worker_died``). A worker runs at most one sync call at a time, so a sync call's clock
never includes time queued behind another; async calls share a worker and run concurrently.

The scorer lives for the whole run (workers and any server a reward starts in ``start()`` are owned by
it) and returns the scored groups as object refs, so trajectories never pass through the driver.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import ray

from relayrl.rewards.scoring import (
    Batch,
    Call,
    CallResult,
    RewardError,
    RewardFns,
    Scored,
    check_error_rate,
    fill_rewards,
    flatten,
    fn_metrics,
    invoke,
    is_async,
    plan_calls,
    reward_metrics,
    unique_names,
)


class RewardWorker:
    """Runs reward calls in its own process: async functions on the event loop, sync ones on one thread."""

    def __init__(self, fns: list[Callable]) -> None:
        self.fns = fns
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward")

    async def ready(self) -> bool:
        return True

    async def call(
        self, fn: int, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]
    ) -> CallResult:
        return await invoke(self.fns[fn], prompts, completions, columns, self.executor)


@dataclass
class _Slot:
    """One worker process and what is running on it."""

    handle: Any
    ready_ref: Any  # resolves once the process has started (None: known ready)
    sync_busy: bool = False
    running: int = 0


@dataclass
class _Running:
    call: int  # index into the calls of this round
    slot: _Slot
    deadline: float
    retried: bool


@dataclass
class Dispatcher:
    """Sends calls to worker slots, enforces the per-call timeout, replaces killed or dead workers."""

    fns: list[Callable]
    timeout_s: float
    num_workers: int
    worker_cpus: float
    slots: list[_Slot] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.is_async = [is_async(fn) for fn in self.fns]
        self.slots = [self._spawn() for _ in range(self.num_workers)]

    def _spawn(self) -> _Slot:
        handle = ray.remote(RewardWorker).options(num_cpus=self.worker_cpus).remote(self.fns)
        return _Slot(handle, handle.ready.remote())  # type: ignore[attr-defined]  # Ray adds .remote

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Block until every worker started; a second call (nothing left to wait for) returns at once."""
        try:
            ray.get([s.ready_ref for s in self.slots if s.ready_ref is not None], timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - e.g. a reward function that cannot be unpickled there
            raise RewardError(
                f"reward workers did not start: {_cause_line(exc)}; make every reward function "
                "importable (module:function on PYTHONPATH) and picklable"
            ) from None
        for s in self.slots:
            s.ready_ref = None

    def run(self, batch: Batch, calls: list[Call]) -> list[CallResult]:
        """Run every call; returns one result per call, in order. Never raises for a reward's failure."""
        results: list[CallResult | None] = [None] * len(calls)
        queue: deque[tuple[int, bool]] = deque((i, False) for i in range(len(calls)))
        running: dict[Any, _Running] = {}
        while queue or running:
            self._submit(batch, calls, queue, running)
            self._collect(calls, results, queue, running)
        return results  # type: ignore[return-value]

    def _submit(self, batch: Batch, calls: list[Call], queue: deque, running: dict) -> None:
        for _ in range(len(queue)):
            i, retried = queue.popleft()
            slot = self._pick(self.is_async[calls[i].fn])
            if slot is None:
                queue.append((i, retried))
                continue
            call = calls[i]
            ref = slot.handle.call.remote(call.fn, *batch.slice(call.start, call.stop))
            running[ref] = _Running(i, slot, time.monotonic() + self.timeout_s, retried)
            slot.running += 1
            slot.sync_busy |= not self.is_async[call.fn]

    def _pick(self, async_call: bool) -> _Slot | None:
        """The least busy started worker that may take the call (sync calls need a free sync thread)."""
        for s in self.slots:
            if s.ready_ref is not None and ray.wait([s.ready_ref], timeout=0)[0]:
                s.ready_ref = None
        free = [s for s in self.slots if s.ready_ref is None and (async_call or not s.sync_busy)]
        return min(free, key=lambda s: s.running) if free else None

    def _collect(self, calls: list[Call], results: list, queue: deque, running: dict) -> None:
        """Wait for the next result, deadline or worker start; record results and timeouts."""
        starting = [s.ready_ref for s in self.slots if s.ready_ref is not None]
        if not running and not starting:
            return
        deadline = min((r.deadline for r in running.values()), default=time.monotonic() + 1.0)
        ready, _ = ray.wait(list(running) + starting, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        for ref in ready:
            task = running.pop(ref, None)
            if task is None:  # a worker finished starting, or its call was re-queued
                continue
            task.slot.running -= 1
            task.slot.sync_busy &= self.is_async[calls[task.call].fn]
            try:
                results[task.call] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                results[task.call] = self._lost(calls[task.call], "worker_died", _cause_line(exc))
                self._replace(task.slot, calls, results, queue, running)
        now = time.monotonic()
        for ref, task in list(running.items()):
            if ref in running and task.deadline <= now:
                running.pop(ref)
                results[task.call] = self._lost(
                    calls[task.call], "timeout", f"took longer than reward.timeout_s={self.timeout_s:g}; worker killed"
                )
                self._replace(task.slot, calls, results, queue, running)

    @staticmethod
    def _lost(call: Call, reason: str, detail: str) -> CallResult:
        return CallResult.failed(call.stop - call.start, reason, detail)

    def _replace(self, slot: _Slot, calls: list[Call], results: list, queue: deque, running: dict) -> None:
        """Kill ``slot``'s process, start a new one in its place; its other calls go again (once)."""
        ray.kill(slot.handle, no_restart=True)
        for ref, task in list(running.items()):
            if task.slot is slot:
                running.pop(ref)
                if task.retried:
                    results[task.call] = self._lost(calls[task.call], "worker_died", "its worker was killed twice")
                else:
                    queue.append((task.call, True))
        fresh = self._spawn()
        slot.handle, slot.ready_ref, slot.sync_busy, slot.running = fresh.handle, fresh.ready_ref, False, 0

    def shutdown(self) -> None:
        for s in self.slots:
            ray.kill(s.handle, no_restart=True)


def _cause_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc
    return " ".join(f"{type(cause).__name__}: {cause}".split())[:200]


class RewardScorer:
    """Ray actor: scores each step's groups with the worker pool; lives for the whole run."""

    def __init__(
        self,
        fns: RewardFns,
        timeout_s: float,
        num_workers: int,
        groups_per_call: int,
        max_error_rate: float,
        worker_cpus: float,
    ) -> None:
        self.fns = unique_names(fns)
        for _, fn, _ in self.fns:  # e.g. a reward model starts its server once, owned by this actor
            start = getattr(fn, "start", None)
            if callable(start):
                start()
        self.groups_per_call, self.max_error_rate = groups_per_call, max_error_rate
        self.dispatcher = Dispatcher([fn for _, fn, _ in self.fns], timeout_s, num_workers, worker_cpus)

    def ready(self) -> bool:
        self.dispatcher.wait_ready()
        return True

    def score(self, summarize: Callable[[list], dict] | None, *replica_groups: list) -> tuple:
        """Score all groups of the step in place; return them per replica, then a ``Scored``.

        ``summarize(groups) -> dict`` adds the caller's metrics (e.g. rollout lengths, sample rows).
        Raises ``RewardError`` when ``check_error_rate`` says the run should stop.
        """
        flat = [g for groups in replica_groups for g in groups]
        calls = plan_calls(flat, len(self.fns), self.groups_per_call)
        fill_rewards(flat, self.fns, calls, self.dispatcher.run(flatten(flat), calls))
        check_error_rate(flat, self.max_error_rate)
        metrics = {**reward_metrics(flat), **fn_metrics(self.fns), **(summarize(flat) if summarize else {})}
        return (*replica_groups, Scored.of(flat, metrics))

    def shutdown(self) -> None:
        self.dispatcher.shutdown()


class RewardPool:
    """The driver's handle on a ``RewardScorer``: start it, score a step's refs, stop it."""

    def __init__(self, scorer: Any) -> None:
        self.scorer = scorer

    @classmethod
    def start(
        cls,
        fns: RewardFns,
        timeout_s: float = 60.0,
        num_workers: int = 2,
        groups_per_call: int = 1,
        max_error_rate: float = 0.25,
        cpus: float = 1.0,
    ) -> RewardPool:
        """Start the scorer and ``num_workers`` workers, sharing ``cpus`` Ray CPUs; wait until they run.

        Then score nothing once: the first ``score`` call on a fresh scorer pays Ray's one-time set-up of
        the actor's call path, far more than a later call, which would otherwise land in the first step's
        ``timing/reward``; here it overlaps the engines' start."""
        worker_cpus = cpus / num_workers
        scorer = (
            ray.remote(RewardScorer)
            .options(num_cpus=0)
            .remote(fns, timeout_s, num_workers, groups_per_call, max_error_rate, worker_cpus)
        )
        pool = cls(scorer)
        try:
            pool.result(scorer.ready.remote())  # type: ignore[attr-defined]  # Ray adds .remote
        except ray.exceptions.RayActorError as exc:  # the scorer's __init__ (a reward's start()) failed
            raise RewardError(
                f"reward scorer did not start: {str(exc).splitlines()[0][:200]}; "
                "check the reward functions' start() (e.g. a reward model path)"
            ) from None
        warm_up = scorer.score.options(num_returns=1)  # type: ignore[attr-defined]  # Ray adds .options
        pool.result(warm_up.remote(None))  # the first call's set-up, off the first step (docstring)
        return pool

    def score(self, group_refs: list, summarize: Callable[[list], dict] | None = None) -> tuple[list, Scored]:
        """Refs of the scored groups (one per input ref) and their ``Scored`` (fetched here: small)."""
        refs, scored = self.submit(group_refs, summarize)
        return refs, self.result(scored)

    def submit(self, group_refs: list, summarize: Callable[[list], dict] | None = None) -> tuple[list, Any]:
        """Start scoring without waiting: refs of the scored groups and the ref of their ``Scored``, for a
        caller that waits on it beside other work (``ray.wait``) and reads it with ``result``."""
        out = self.scorer.score.options(num_returns=len(group_refs) + 1).remote(summarize, *group_refs)
        out = out if isinstance(out, list) else [out]
        return out[:-1], out[-1]

    @staticmethod
    def result(ref: Any) -> Any:
        """``ray.get`` that re-raises a scorer's ``RewardError`` as one line rather than a remote traceback."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, RewardError):
                raise RewardError(str(exc.cause)) from None
            raise

    def shutdown(self) -> None:
        # best effort: the scorer is killed next, and its workers with it
        with contextlib.suppress(Exception):
            ray.get(self.scorer.shutdown.remote(), timeout=30)
        ray.kill(self.scorer)
