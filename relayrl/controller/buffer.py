"""Replay buffer and admission control: how rollout runs ahead of training by at most k versions.

The buffer holds scored trajectory groups *by reference* (Ray ObjectRefs of ``list[TrajectoryGroup]``,
one per generate call) with the metadata the step policy (``controller/policy.py``) needs: prompt ids,
the oldest and newest policy version among their tokens, and when they arrived. The trainer at
version v takes, oldest first, only entries whose oldest version is >= v - k (``max_staleness``;
k = 0 is strictly on-policy).

Why rollout is *paused* rather than stale work thrown away: a batch that is still generating when it
goes stale is dominated by its long completions (short ones finished and were already used), so
discarding stale work biases training toward short samples and wastes the engine time. Instead
``Admission`` lets a replica start a new batch only if every batch started so far can still be trained
within the bound:

    groups_started + chunk <= (v + k + 1) * B        (v: trainer version, B: groups per train step)

A batch started at engine version u >= v is the ((groups_started / B) + 1)-th step's data, trained at
version <= u + k, so no admitted batch can go stale; ``take`` checks the bound anyway and, unless a
drop policy is configured, raises if it ever breaks. ``capacity`` (groups) adds backpressure on top.

DAPO's dynamic sampling refills a step with groups whose rewards vary: the buffer then counts an
entry's *useful* groups towards a step, groups that turned out useless are *wasted* (they free their
admission budget, so more prompts are drawn), and a step that takes more useful groups than B (a call is
never split) adds the surplus to what training consumed. In flight, a call counts as all useful, so

    useful groups started - useful groups consumed by steps < (k + 1) * B

still guarantees that a call admitted at version v is taken by the step at v + k: each of those k + 1
steps consumes >= B useful groups. A step that cannot fill up within ``max_groups`` would break that,
so the policy stops the run there (as verl does) rather than train on a short batch.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from relayrl.monitor.schema import STALENESS_MAX


class StalenessError(RuntimeError):
    """An entry older than the bound reached ``take`` with no drop policy configured."""


@dataclass
class Entry:
    """One generate call's scored groups, by reference."""

    seq: int  # start order of its generate call (0, 1, 2, ...)
    ref: Any  # ObjectRef of list[TrajectoryGroup] (or the list itself, in tests)
    prompt_ids: list[int]
    min_version: int  # oldest policy version among its tokens
    max_version: int
    metrics: dict[str, Any] = field(default_factory=dict)  # the scorer's per-call metrics
    created: float = field(default_factory=time.monotonic)
    useful: int | None = None  # groups that count towards a step (dynamic sampling); None: all of them

    @property
    def num_groups(self) -> int:
        return len(self.prompt_ids)

    @property
    def counted(self) -> int:
        return self.num_groups if self.useful is None else self.useful


class ReplayBuffer:
    """Entries keyed by start order; ``take`` hands them out in that order, never skipping one.

    Start order, not arrival order: with several replicas a later batch can finish first, and
    training it before the earlier one would push the earlier one past the bound that admission
    control planned for. So the trainer waits for the next batch in line.
    """

    def __init__(self, max_staleness: int, capacity: int | None = None, drop_stale: bool = False):
        if max_staleness < 0:
            raise ValueError(f"max_staleness={max_staleness} must be >= 0 (0: on-policy)")
        self.k, self.capacity, self.drop_stale = max_staleness, capacity, drop_stale
        self.entries: dict[int, Entry] = {}
        self.next_seq = 0
        self.dropped: Counter[str] = Counter()

    def __len__(self) -> int:
        return sum(e.num_groups for e in self.entries.values())

    def has_room(self, groups: int) -> bool:
        return self.capacity is None or len(self) + groups <= self.capacity

    def put(self, entry: Entry) -> None:
        if entry.seq < self.next_seq or entry.seq in self.entries:
            raise ValueError(f"entry seq {entry.seq} was already put or taken")
        self.entries[entry.seq] = entry

    def _stale(self, e: Entry, version: int) -> bool:
        return e.min_version < version - self.k

    def ready(self, version: int, groups: int, max_groups: int | None = None) -> bool:
        """Would a ``take`` now fill up? The consecutive entries from ``next_seq`` (stale ones it would drop
        passed over) until they count >= ``groups`` or an entry has not arrived."""
        tally = _Tally(groups, max_groups)
        seq = self.next_seq
        while seq in self.entries and not tally.full:
            if not (self.drop_stale and self._stale(self.entries[seq], version)):
                tally.add(self.entries[seq])
            seq += 1
        return tally.full

    def take(self, version: int, groups: int, max_groups: int | None = None) -> list[Entry]:
        """Pop the next entries in start order counting >= ``groups`` groups (``Entry.counted``; or holding
        >= ``max_groups`` in all: a dynamic-sampling step that cannot fill up), for training at ``version``.

        An entry older than ``version - k`` raises ``StalenessError``, or with ``drop_stale`` is dropped
        with its reason counted (and the next one in line is taken instead: call ``ready`` first).
        """
        out: list[Entry] = []
        tally = _Tally(groups, max_groups)
        while not tally.full:
            if self.next_seq not in self.entries:
                raise RuntimeError(f"take({groups}) but entry {self.next_seq} has not arrived; call ready() first")
            e = self.entries.pop(self.next_seq)
            self.next_seq += 1
            if not self._stale(e, version):
                out.append(tally.add(e))
            elif self.drop_stale:
                self.dropped[f"stale>{self.k}"] += e.num_groups
            else:
                raise StalenessError(
                    f"entry {e.seq} from v{e.min_version} reached the trainer at v{version} "
                    f"(max_staleness={self.k}); admission control should prevent this"
                )
        return out

    def skip_to(self, seq: int) -> None:
        """After a resume: entries before ``seq`` were trained before the checkpoint."""
        if self.entries:
            raise RuntimeError("skip_to on a buffer that already holds entries")
        self.next_seq = seq

    def stats(self) -> dict[str, float]:
        out = {"buffer/depth": float(len(self)), "buffer/entries": float(len(self.entries))}
        out.update({f"buffer/dropped/{k}": float(v) for k, v in self.dropped.items()})
        return out


@dataclass
class _Tally:
    """Running totals of the entries a step has gathered: full once they count >= ``groups`` (``Entry.counted``)
    or hold >= ``max_groups`` in all. Kept as totals so that gathering n entries costs O(n), not O(n^2)."""

    groups: int
    max_groups: int | None
    counted: int = 0
    held: int = 0

    def add(self, entry: Entry) -> Entry:
        self.counted += entry.counted
        self.held += entry.num_groups
        return entry

    @property
    def full(self) -> bool:
        return self.counted >= self.groups or (self.max_groups is not None and self.held >= self.max_groups)


@dataclass
class Admission:
    """May a replica start a batch of ``chunk`` groups now? ``started`` counts every group ever started;
    with dynamic sampling ``wasted`` those without reward spread and ``surplus`` the useful groups steps
    took beyond B each; see the module docstring."""

    max_staleness: int
    groups_per_step: int
    started: int = 0
    wasted: int = 0
    surplus: int = 0

    def allows(self, version: int, chunk: int) -> bool:
        """Groups ahead of the trainer < (k + 1) B; chunks divide B, so without dynamic sampling this is
        ``started + chunk <= (v + k + 1) B``."""
        ahead = self.started - self.wasted - (version * self.groups_per_step + self.surplus)
        return ahead < (self.max_staleness + 1) * self.groups_per_step

    def start(self, chunk: int) -> None:
        self.started += chunk

    def waste(self, groups: int) -> None:
        self.wasted += groups

    def took(self, useful: int) -> None:
        """A step took ``useful`` groups that count (dynamic sampling), where B were planned."""
        self.surplus += useful - self.groups_per_step


def staleness_histogram(entries: list[Entry], version: int) -> dict[str, float]:
    """``staleness/<d>``: groups trained at ``version`` whose oldest token is d versions old; plus max/mean."""
    counts: Counter[int] = Counter()
    for e in entries:
        counts[version - e.min_version] += e.num_groups
    total = sum(counts.values()) or 1
    out = {f"staleness/{d}": float(n) for d, n in sorted(counts.items())}
    out[STALENESS_MAX] = float(max(counts, default=0))
    out["staleness/mean"] = sum(d * n for d, n in counts.items()) / total
    return out
