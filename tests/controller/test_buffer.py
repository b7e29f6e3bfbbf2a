"""Replay buffer, admission control and the step policy: the staleness bound holds whatever the speeds
and failures; nothing lost or repeated.

The property tests drive the real ``StepPolicy`` (the object the scheduler calls) with ``drive``, a
discrete-event loop that only decides timing: which replica finishes next, how long a step trains,
which generate calls die. Every decision (what to launch, when a step is taken, retries, counts) is
the policy's own.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.controller.buffer import Admission, Entry, ReplayBuffer, StalenessError, staleness_histogram
from relayrl.controller.policy import PolicyConfig, ShortStep, StepPolicy
from relayrl.data import Prompt


def entry(seq: int, version: int, groups: int = 2) -> Entry:
    return Entry(seq, f"ref{seq}", list(range(seq * groups, (seq + 1) * groups)), version, version)


def test_take_follows_start_order_and_waits_for_the_next_in_line():
    buf = ReplayBuffer(max_staleness=1)
    buf.put(entry(1, 0))
    assert not buf.ready(0, 2)  # entry 0 started first and has not arrived
    buf.put(entry(0, 0))
    assert buf.ready(1, 4) and not buf.ready(1, 6)
    assert [e.seq for e in buf.take(version=1, groups=4)] == [0, 1]
    assert len(buf) == 0 and buf.next_seq == 2
    with pytest.raises(ValueError, match="already put or taken"):
        buf.put(entry(1, 0))


def test_stale_entry_raises_or_is_dropped_with_its_reason():
    buf = ReplayBuffer(max_staleness=1)
    buf.put(entry(0, 0))
    with pytest.raises(StalenessError, match="from v0 reached the trainer at v2"):
        buf.take(version=2, groups=2)
    dropping = ReplayBuffer(max_staleness=1, drop_stale=True)
    dropping.put(entry(0, 0))
    assert not dropping.ready(2, 2)  # entry 0 would be dropped and nothing follows yet
    dropping.put(entry(1, 2))
    assert dropping.ready(2, 2)
    assert [e.seq for e in dropping.take(version=2, groups=2)] == [1]
    assert dropping.stats()["buffer/dropped/stale>1"] == 2


def test_admission_bound_by_hand():
    adm = Admission(max_staleness=1, groups_per_step=4)
    # at v=0 with k=1: up to (0+1+1)*4 = 8 groups may be started, in chunks of 2
    for _ in range(4):
        assert adm.allows(version=0, chunk=2)
        adm.start(2)
    assert not adm.allows(version=0, chunk=2) and adm.allows(version=1, chunk=2)


def test_staleness_histogram():
    h = staleness_histogram([entry(0, 3), entry(1, 2), entry(2, 2)], version=3)
    assert h == {"staleness/0": 2.0, "staleness/1": 4.0, "staleness/max": 1.0, "staleness/mean": 4 / 6}


class Counter:
    """A sampler stand-in: chunks of consecutive prompt ids, so the start order is the id order."""

    def __init__(self, chunk: int):
        self.chunk, self.next = chunk, 0

    def next_batch(self) -> list[Prompt]:
        ids = range(self.next, self.next + self.chunk)
        self.next += self.chunk
        return [Prompt(i, f"p{i}") for i in ids]

    def state_dict(self) -> dict:
        return {"next": self.next}

    def load_state_dict(self, state: dict) -> None:
        self.next = state["next"]


@dataclass
class Trace:
    """What ``drive`` saw: staleness of every trained group, prompt ids trained in order, per step
    (useful, drawn) groups, the ShortStep that stopped the run (if any), deaths injected."""

    stale: list[int] = field(default_factory=list)
    trained: list[int] = field(default_factory=list)
    taken: list[tuple[int, int]] = field(default_factory=list)
    short: ShortStep | None = None
    deaths: int = 0


def make_policy(k: int, replicas: int, chunk: int, **kw) -> StepPolicy:
    sampler = Counter(chunk)
    return StepPolicy(PolicyConfig(k, replicas * chunk, replicas, **kw), sampler.next_batch, sampler)


def drive(
    policy: StepPolicy,
    steps: int,
    gen: list[float],
    train: list[float],
    useful: list[float] | None = None,
    deaths: list[bool] | None = None,
) -> Trace:
    """Run ``policy`` to ``steps`` steps in simulated time. Generate calls take ``gen`` durations (cycled),
    steps ``train``; a finished call has ``useful`` share of its groups with reward spread, or dies
    instead when the next ``deaths`` draw says so. Engines are at the policy's version (a sync is part
    of a step). Checks after every event that the accounting holds and colocated never overlaps."""
    gens, trains = itertools.cycle(gen), itertools.cycle(train)
    shares, dies = itertools.cycle(useful or [1.0]), itertools.cycle(deaths or [False])
    trace, events, order = Trace(), [], itertools.count()
    idle, now, training = list(range(policy.pc.replicas)), 0.0, False
    while policy.version < steps:
        for launch in policy.launches(idle):
            assert not (policy.pc.colocated and training)
            idle.remove(launch.replica)
            heapq.heappush(events, (now + next(gens), next(order), launch, policy.version))
        try:
            step = None if training else policy.take_step()
        except ShortStep as exc:
            trace.short = exc
            return trace
        if step is not None:
            entries = step.entries
            assert not (policy.pc.colocated and policy.generating)
            training = True
            trace.taken.append((sum(e.counted for e in entries), sum(e.num_groups for e in entries)))
            trace.stale += [policy.version - e.min_version for e in entries for _ in e.prompt_ids]
            heapq.heappush(events, (now + next(trains), next(order), None, None))
        assert events, f"stalled at v{policy.version}"
        now, _, launch, v0 = heapq.heappop(events)
        if launch is None:  # the step trained and synced
            training = False
            trace.trained += policy.on_trained()
        elif next(dies):  # the replica died mid-call
            trace.deaths += 1
            idle.append(launch.replica)
            policy.on_failed(launch.seq)
        else:
            idle.append(launch.replica)
            policy.on_scored(
                Entry(
                    launch.seq,
                    None,
                    launch.prompt_ids,
                    v0,
                    policy.version,
                    useful=round(next(shares) * len(launch.prompts)),
                )
            )
        policy.check_accounting()
    return trace


times = st.lists(st.floats(0.01, 10.0), min_size=1, max_size=7)


@settings(max_examples=150, deadline=None)
@given(
    k=st.integers(0, 3),
    replicas=st.integers(1, 3),
    chunk=st.integers(1, 3),
    steps=st.integers(1, 8),
    gen=times,
    train=times,
    deaths=st.lists(st.booleans(), min_size=1, max_size=5),
    colocated=st.booleans(),
    capacity=st.sampled_from([None, 1, 2]),
)
def test_staleness_bound_never_violated_and_every_group_trained_once(
    k, replicas, chunk, steps, gen, train, deaths, colocated, capacity
):
    """Whatever the speeds, replica deaths (the chunk regenerated under its seq), colocation or buffer
    capacity (in steps' worth of groups): staleness <= k, full steps in start order, none twice."""
    B = replicas * chunk
    policy = make_policy(k, replicas, chunk, colocated=colocated, capacity=capacity and capacity * B)
    trace = drive(policy, steps, gen, train, deaths=[*deaths, False])  # a call that always dies never ends
    assert max(trace.stale) <= k
    assert len(trace.trained) == len(set(trace.trained)) == steps * B  # none twice, a full batch a step
    assert trace.trained == list(range(steps * B))  # in start order, none skipped
    assert policy.counts["trained"] == steps * B and policy.counts["dropped"] == 0
    assert policy.counts["issued"] == steps * B + policy.in_flight()  # issued = trained + in flight
    if k == 0:
        assert set(trace.stale) == {0}  # sync mode: strictly on-policy


@settings(max_examples=150, deadline=None)
@given(
    k=st.integers(0, 3),
    replicas=st.integers(1, 3),
    chunk=st.integers(1, 3),
    steps=st.integers(1, 8),
    gen=times,
    train=times,
    useful=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6),
    cap=st.sampled_from([None, 2, 10]),
)
def test_dynamic_sampling_refills_every_step_within_the_staleness_bound(
    k, replicas, chunk, steps, gen, train, useful, cap
):
    """DAPO refill: calls whose groups lack reward spread free admission for more prompts; every step
    still gets B useful groups (or the run stops at the cap), in start order, never staler than k."""
    B = replicas * chunk
    useful = useful if any(round(u * chunk) for u in useful) else [*useful, 1.0]  # else nothing ever fills
    policy = make_policy(k, replicas, chunk, refill=True, max_sampling_batches=cap or 0)
    trace = drive(policy, steps, gen, train, useful)
    assert max(trace.stale, default=0) <= k
    assert len(trace.trained) == len(set(trace.trained))
    assert trace.trained == list(range(len(trace.trained)))  # start order, none skipped
    assert all(counted >= B for counted, _ in trace.taken[: policy.version])
    if trace.short is None:  # every step trained ...
        assert policy.version == steps
    else:  # ... or the run stopped, only at the cap
        assert cap is not None and trace.short.drawn >= cap * B and trace.short.useful < B
        assert policy.version < steps


def test_a_failed_chunk_is_regenerated_first_with_the_same_seq_and_prompts():
    policy = make_policy(k=0, replicas=2, chunk=1)
    first = policy.launches([0, 1])
    assert [(x.seq, x.prompt_ids) for x in first] == [(0, [0]), (1, [1])]
    policy.on_failed(0)
    (again,) = policy.launches([1, 0])  # k=0: B started, only the retry may start
    assert (again.seq, again.replica, again.prompt_ids) == (0, 1, [0])
    assert set(policy.generating) == {0, 1} and policy.counts["issued"] == 2  # not issued twice


def test_useful_groups_fill_a_step_and_wasted_ones_reopen_admission():
    buf = ReplayBuffer(max_staleness=0)
    for seq, useful in enumerate([1, 0, 2]):  # calls of 2 groups: 1, 0 and 2 with reward spread
        e = entry(seq, 0)
        e.useful = useful
        buf.put(e)
    assert not buf.ready(0, 4) and buf.ready(0, 3) and buf.ready(0, 4, max_groups=6)
    assert [e.seq for e in buf.take(version=0, groups=3)] == [0, 1, 2]  # 1 + 0 + 2 = 3 useful
    adm = Admission(max_staleness=0, groups_per_step=4)
    adm.start(4)
    assert not adm.allows(version=0, chunk=2)
    adm.waste(3)  # 3 of the 4 groups all scored alike: 1 useful
    assert adm.allows(version=0, chunk=2)  # 1 < 4 ahead: draw more (even past 4 in all)
    adm.start(2), adm.start(2)
    assert not adm.allows(version=0, chunk=2)  # 5 useful ahead if all in flight are
    adm.took(5)  # step 1 took 5 (a call is not split): surplus 1
    assert (adm.surplus, adm.allows(version=1, chunk=2)) == (1, True)  # 8 - 3 - 5 = 0 ahead


def test_a_step_that_cannot_fill_up_stops_the_run_with_the_fix():
    """One replica, 8-prompt calls for a 4-group step (B=4 set by hand), cap 2 x 4 = 8 groups drawn."""
    policy = StepPolicy(PolicyConfig(0, 8, 1, refill=True, max_sampling_batches=2), Counter(8).next_batch)
    policy.B = policy.admission.groups_per_step = 4
    policy.max_groups = 8
    (launch,) = policy.launches([0])
    policy.on_scored(Entry(launch.seq, None, launch.prompt_ids, 0, 0, useful=3))
    with pytest.raises(
        ShortStep, match=r"drew 8 groups for step 1 and only 3 of the 4 needed.*raise algorithm\.max_sampling_batches"
    ):
        policy.take_step()


def test_a_step_with_surplus_useful_groups_credits_admission():
    policy = StepPolicy(PolicyConfig(0, 8, 1, refill=True), Counter(8).next_batch)
    policy.B = policy.admission.groups_per_step = 4
    (launch,) = policy.launches([0])
    policy.on_scored(Entry(launch.seq, None, launch.prompt_ids, 0, 0, useful=5))
    assert [e.seq for e in policy.take_step().entries] == [0] and policy.admission.surplus == 1


def test_state_dict_round_trip_regenerates_unfinished_chunks_first():
    """A checkpoint at step 1 with chunk 1 scored but untrained and chunk 2 in flight: the resumed
    policy issues those prompts again, in order, before drawing new ones; counts are kept."""
    policy = make_policy(k=1, replicas=1, chunk=2)
    for x in policy.launches([0]) + policy.launches([0]):  # k=1 at v0: two steps' worth
        policy.on_scored(Entry(x.seq, None, x.prompt_ids, 0, 0))
    assert policy.launches([0]) == []
    assert [e.seq for e in policy.take_step().entries] == [0]
    policy.on_trained()
    assert [x.seq for x in policy.launches([0])] == [2]  # v1: one more chunk admitted, in flight
    state = {"step": policy.version, **policy.state_dict()}
    resumed = make_policy(k=1, replicas=1, chunk=2)
    resumed.load_state_dict(state)
    again = [resumed.launches([0])[0] for _ in range(2)]
    assert [(x.seq, x.prompt_ids) for x in again] == [(1, [2, 3]), (2, [4, 5])]
    assert resumed.counts == policy.counts
    assert resumed.sampler.next == policy.sampler.next
