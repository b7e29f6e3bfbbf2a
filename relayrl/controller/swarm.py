"""The rollout replica set of a run, as the step policy sees it: which replicas take work, how fast each is,
and which free slot a chunk goes to. Plain data, no Ray: ``StepPolicy`` owns one.

- **Joins and leaves.** A replica is ``live`` from ``join`` until ``remove``. ``retire`` marks it
  ``draining``: it takes no new chunk; its chunks in flight finish (or are handed back to be generated
  again elsewhere, same seq), and the scheduler ends it once none is left.
- **Throughput.** ``rate(r)`` is the groups replica r finished per second it was busy (at least one call in
  flight), measured by the loop's clock. A replica not measured yet counts at the mean of those that are.
- **Placement.** A chunk goes to the free slot whose replica would finish it first. Once every candidate
  replica has run calls at two or more loads, the finish is predicted from its own calls: a call's duration grows
  about linearly with the calls running beside it on the same engine (``d = a + b * load``: a is the latency of
  the longest completion, b what each more group costs in a batch), fitted per replica by least squares over its
  recent loads (``LOADS_KEPT``), and the chunk goes where ``a + b * (running + 1)`` is least. Until then, by
  throughput: ``(running + 1) / rate``. Throughput alone gives a replica half as fast a third of a step's groups;
  when the fixed latency a is large that is too many (its few groups still take 2a), and the fitted finish gives
  it fewer, so both finish together (``bench/swarm_speeds.py``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

LOADS_KEPT = 16
"""Distinct loads a replica's duration fit keeps (the most recent), each with the mean of its recent calls."""


@dataclass
class ReplicaSet:
    """The live replicas, the draining ones and their measured throughput (module docstring)."""

    live: set[int] = field(default_factory=set)
    draining: set[int] = field(default_factory=set)
    running: Counter[int] = field(default_factory=Counter)  # calls generating on each replica now
    groups: Counter[int] = field(default_factory=Counter)  # groups each replica finished
    busy_s: defaultdict[int, float] = field(default_factory=lambda: defaultdict(float))  # seconds generating
    since: dict[int, float] = field(default_factory=dict)  # when its running calls last changed
    durations: defaultdict[int, dict[int, float]] = field(default_factory=lambda: defaultdict(dict))
    """replica -> {load a call started at: its calls' mean duration there, recent ones weighing more}"""
    next_id: int = 0

    @classmethod
    def of(cls, n: int) -> ReplicaSet:
        return cls(live=set(range(n)), next_id=n)

    # ---- membership ---------------------------------------------------------------------------------------
    def join(self) -> int:
        """A new replica's id (never reused, so a late result cannot be taken for the newcomer's)."""
        r, self.next_id = self.next_id, self.next_id + 1
        self.live.add(r)
        return r

    def retire(self, r: int) -> None:
        if r not in self.live:
            raise ValueError(f"replica {r} is not live (live: {sorted(self.live)})")
        self.draining.add(r)

    def remove(self, r: int) -> None:
        self.live.discard(r)
        self.draining.discard(r)

    def serving(self) -> list[int]:
        """Replicas that take new work: live and not draining."""
        return sorted(self.live - self.draining)

    def takes_work(self, r: int) -> bool:
        return r in self.live and r not in self.draining

    # ---- throughput ---------------------------------------------------------------------------------------
    def started(self, r: int, now: float) -> None:
        self._tick(r, now)
        self.running[r] += 1

    def stopped(self, r: int, now: float, groups: int = 0, lost_s: float = 0.0) -> None:
        """A call on ``r`` stopped generating: finished with ``groups`` groups, or cancelled or failed (0). A lost
        copy's ``lost_s`` leaves the busy time: work that produced nothing must not make the replica look slow."""
        self._tick(r, now)
        self.busy_s[r] = max(0.0, self.busy_s[r] - max(0.0, lost_s))
        self.running[r] = max(0, self.running[r] - 1)
        self.groups[r] += groups

    def _tick(self, r: int, now: float) -> None:
        if self.running[r] > 0:
            self.busy_s[r] += max(0.0, now - self.since.get(r, now))
        self.since[r] = now

    def observe(self, r: int, load: int, seconds: float) -> None:
        """A call on ``r`` that started with ``load`` calls running there (itself included) took ``seconds``."""
        seen = self.durations[r]
        seen[load] = (seen.pop(load) + seconds) / 2 if load in seen else seconds  # re-inserted: most recent last
        while len(seen) > LOADS_KEPT:
            del seen[next(iter(seen))]

    def finish_model(self, r: int) -> tuple[float, float] | None:
        """``(a, b)`` of ``d = a + b * load`` fitted over ``r``'s recent loads; None without two loads, or when the
        fit says more load is not slower (noise: placement then goes by throughput)."""
        points = self.durations.get(r, {})
        if len(points) < 2:
            return None
        n = len(points)
        mx, my = sum(points) / n, sum(points.values()) / n
        var = sum((x - mx) ** 2 for x in points)
        b = sum((x - mx) * (y - my) for x, y in points.items()) / var
        return (my - b * mx, b) if b > 0 else None

    def rate(self, r: int, unmeasured: float | None = None) -> float:
        """Groups per busy second; for a replica not measured yet ``unmeasured``, by default the mean of the
        measured replicas (1.0 if none is)."""
        if self.measured(r):
            return self.groups[r] / self.busy_s[r]
        return self._mean_rate() if unmeasured is None else unmeasured

    def _mean_rate(self) -> float:
        known = [self.groups[q] / self.busy_s[q] for q in self.live if self.measured(q)]
        return sum(known) / len(known) if known else 1.0

    def rates(self) -> dict[int, float]:
        return {r: self.rate(r) for r in sorted(self.live)}

    # ---- placement ----------------------------------------------------------------------------------------
    def pick(self, free: list[int], extra: Counter[int]) -> int:
        """The index in ``free`` (replica ids, one per free slot) of the slot whose replica would finish one
        more chunk first, counting ``extra`` chunks placed on it in this round: by the fitted finish when every
        candidate has one, else by throughput (module docstring); ties go to a replica not measured yet (a
        joiner gets work, and so a rate), then to the earlier slot. Only each replica's first free slot is
        weighed (its others finish no sooner), so a pick costs one pass over ``free`` and one fit a replica."""
        first: dict[int, int] = {}
        replicas = len(set(free))
        for i, r in enumerate(free):
            first.setdefault(r, i)
            if len(first) == replicas:  # every replica's first slot found: the rest are later slots
                break
        models = {r: self.finish_model(r) for r in first}
        fitted, mean = all(models.values()), self._mean_rate()

        def key(r: int) -> tuple[float, bool, int]:
            load, model = self.running[r] + extra[r] + 1, models[r]
            finish = model[0] + model[1] * load if fitted and model else load / self.rate(r, mean)
            return finish, self.measured(r), first[r]

        return first[min(first, key=key)]

    def measured(self, r: int) -> bool:
        return bool(self.groups[r]) and self.busy_s[r] > 0

    def copies(self, idle: list[int], stragglers: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """(seq, replica) copies to start: each ``idle`` replica (running no chunk and no copy) takes one copy: the
        oldest of ``stragglers`` ((seq, replica) still generating, oldest first, not yet copied) that runs on
        another replica no faster than it, one copy per chunk. The copy draws the same seeded samples, so
        whichever comes back first is the same data (which one wins does not select short completions); the
        other is cancelled or discarded (``StepPolicy.reissued``), never trained twice."""
        out, left = [], list(stragglers)
        for r in idle:
            match = next(((seq, q) for seq, q in left if q != r and self.rate(r) >= self.rate(q)), None)
            if match is not None:
                left.remove(match)
                out.append((match[0], r))
        return out

    def slowest(self, candidates: list[int]) -> int:
        """The replica to retire first: the slowest, the newest among equals."""
        return min(candidates, key=lambda r: (self.rate(r), -r))
