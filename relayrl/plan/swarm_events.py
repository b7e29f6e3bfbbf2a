"""Rollout replicas of different speeds, joining and leaving, in the simulator (``relayrl.plan.simulate``).

What a scenario says, in the cluster file's ``swarm`` section (``Swarm``)::

    swarm:
      speeds: [1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5]   # each rollout replica's relative speed, in id order (default 1)
      events:                                     # membership changes, after a step syncs or at a time
        - {step: 20, leave: 4}                    # the 4 slowest serving replicas leave (the newest among equals)
        - {step: 40, join: 4, speed: 1.0}         # 4 new replicas start; each serves restart_s later
        - {at: 300.0, leave: [2, 5]}              # at 300 simulated seconds, replicas 2 and 5 leave

How the simulated driver applies them (``Elastic``), through the same ``StepPolicy`` calls a real run makes
(``controller/membership.py``), so a join or leave is accounted like a death (STYLE 28):

- **Speed.** An engine at speed s runs s times as fast: its calls' fixed seconds and decode steps each take
  1/s as long (``Devices._engine_speed``). Placement learns the speeds from measured call durations
  (``swarm.ReplicaSet.pick``), never from this list.
- **Leave** (a spot node reclaimed): ``policy.retire(r, hand_back=True)``; its calls still generating are
  cancelled and generated again elsewhere under their seqs, and its engine dies. Its chunks already being
  scored finish; the replica is removed once ``policy.drained(r)``.
- **Join**: a new engine starts and serves ``costs.restart_s()`` later (engine start-up to its first weight
  sync, as a dead replica's replacement costs; the driver does not wait for it). Then it takes the id
  ``policy.replicas.join()`` gives (ids are never reused and index ``engines``, where a left engine stays dead),
  the policy's version and ``pc.slots`` free slots.

A change reaches the driver as an event in the heap: it is applied when the driver next waits (a step's
events after its sync and the per-step overhead), and the driver launches onto what changed at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from relayrl.controller.loop import Loop
from relayrl.plan.fluid import Devices, Engine, Job
from relayrl.plan.records import Span


@dataclass(frozen=True)
class SwarmEvent:
    """After step ``step`` syncs (or at ``at`` simulated seconds): ``leave`` replicas go (a count: the slowest
    serving, the newest among equals; or their ids), or ``join`` new ones start at relative ``speed``."""

    step: int | None = None
    at: float | None = None
    leave: int | tuple[int, ...] = 0
    join: int = 0
    speed: float = 1.0

    def __post_init__(self) -> None:
        if (self.step is None) == (self.at is None):
            raise ValueError(f"swarm event {self}: give exactly one of step (>= 0) or at (seconds)")
        if bool(self.leave) == bool(self.join):
            raise ValueError(f"swarm event {self}: give exactly one of leave (a count or ids) or join (a count)")
        if (self.step is not None and self.step < 0) or (self.at is not None and self.at < 0) or self.speed <= 0:
            raise ValueError(f"swarm event {self}: step and at are >= 0, speed > 0")


@dataclass(frozen=True)
class Swarm:
    """The rollout replicas' speeds (empty: all 1) and their membership events (module docstring)."""

    speeds: tuple[float, ...] = ()
    events: tuple[SwarmEvent, ...] = ()

    def __post_init__(self) -> None:
        if any(s <= 0 for s in self.speeds):
            raise ValueError(f"swarm.speeds={list(self.speeds)}: every speed is > 0 (1: the GPU's own)")

    def speeds_of(self, replicas: int) -> list[float]:
        """One speed a replica; a list for another replica count is an error naming both."""
        if self.speeds and len(self.speeds) != replicas:
            raise ValueError(
                f"swarm.speeds lists {len(self.speeds)} replicas, the cluster has {replicas} "
                "(rollout_gpus / rollout_tp): give one speed per replica"
            )
        return list(self.speeds) or [1.0] * replicas


def parse_swarm(data: dict[str, Any], source: str) -> Swarm:
    """A cluster file's ``swarm`` mapping; an unknown key is an error naming the valid ones."""
    if bad := sorted(set(data) - {"speeds", "events"}):
        raise ValueError(f"{source}: swarm has {', '.join(bad)}; valid: speeds, events")
    events = []
    for ev in data.get("events") or []:
        names = {"step", "at", "leave", "join", "speed"}
        if not isinstance(ev, dict) or (bad := sorted(set(ev) - names)):
            raise ValueError(f"{source}: swarm event {ev!r}: a mapping of {', '.join(sorted(names))}")
        leave = ev.get("leave", 0)
        events.append(SwarmEvent(**{**ev, "leave": tuple(leave) if isinstance(leave, list) else leave}))
    return Swarm(tuple(float(s) for s in data.get("speeds") or ()), tuple(events))


@dataclass(eq=False)
class Change(Job):
    """A membership change in the event heap: ``leave`` (of ``replica``; -1: the slowest serving) or ``join``
    (asked for at ``asked``, serving from ``end``, at ``speed``)."""

    speed: float = 1.0
    asked: float = 0.0


@dataclass
class Membership:
    """Changes planned (step events by step) and how many are in the heap (the loop is not stalled on them)."""

    by_step: dict[int, list[SwarmEvent]] = field(default_factory=dict)
    pending: int = 0


class Elastic(Devices, Loop):
    """The simulated loop's joins and leaves (module docstring); ``Simulator`` is one."""

    members: Membership

    def _plan_changes(self, events: Iterable[SwarmEvent]) -> None:
        self.members = Membership()
        for ev in events:
            if ev.at is not None:
                self._push_changes(ev, ev.at)
            else:
                self.members.by_step.setdefault(ev.step or 0, []).append(ev)
        self._stepped(0)

    def _stepped(self, version: int) -> None:
        """The run reached ``version`` (its step synced): that step's events happen now."""
        for ev in self.members.by_step.pop(version, []):
            self._push_changes(ev, self.now)

    def _push_changes(self, ev: SwarmEvent, at: float) -> None:
        if ev.join:
            changes = [
                Change("join", end=at + self.costs.restart_s(), speed=ev.speed, asked=at) for _ in range(ev.join)
            ]
        else:
            ids = ev.leave if isinstance(ev.leave, tuple) else (-1,) * ev.leave
            changes = [Change("leave", end=at, replica=r) for r in ids]
        for change in changes:
            self.members.pending += 1
            self._push(change)

    def _apply_change(self, change: Change) -> None:
        """The driver noticed ``change``: apply it, end the replicas that drained, launch onto what changed."""
        self.members.pending -= 1
        if change.kind == "leave":
            self._leave(change.replica)
        else:
            self._join(change)
        self._remove_drained()
        self._launch()

    def _leave(self, replica: int) -> None:
        serving = self.policy.replicas.serving()
        r = replica if replica >= 0 else self.policy.replicas.slowest(serving)
        if r not in serving or len(serving) == 1:
            raise ValueError(
                f"swarm: replica {r} cannot leave at {self.now:.1f} s: serving {serving} (one must stay serving)"
            )
        self.policy.retire(r, hand_back=True)
        self._cancel_losers()  # its calls leave the engine and their chunks wait to be generated elsewhere
        engine = self.engines[r]
        self._die(engine, r)
        engine.up[1] = self.now

    def _join(self, change: Change) -> None:
        r = self.policy.replicas.join()
        if r != len(self.engines):
            raise RuntimeError(f"replica id {r} does not index the simulator's {len(self.engines)} engines")
        self.engines.append(Engine(self.policy.version, t=self.now, speed=change.speed, up=[self.now, math.inf]))
        self.idle += [r] * self.policy.pc.slots
        self.spans.append(Span(f"rollout/{r}", "restart", change.asked, self.now))

    def _remove_drained(self) -> None:
        for r in sorted(self.policy.replicas.draining):
            if self.policy.drained(r):
                self.policy.replicas.remove(r)


def replicas_in(engines: list[Engine], start: float, end: float) -> float:
    """Engines up over [start, end], on average: those up throughout count 1 each (an exact integer when no
    change falls inside), the others the share of the window they were up."""
    if end <= start:
        return float(sum(e.up[0] <= start < e.up[1] for e in engines))
    full = sum(e.up[0] <= start and e.up[1] >= end for e in engines)
    part = sum(
        max(0.0, min(e.up[1], end) - max(e.up[0], start)) for e in engines if not (e.up[0] <= start and e.up[1] >= end)
    )
    return full + part / (end - start)


def replica_seconds(engines: list[Engine], end: float) -> float:
    """Replica-seconds the rollout pool had engines up from 0 to ``end``."""
    return sum(max(0.0, min(e.up[1], end) - e.up[0]) for e in engines)
