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
import json
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.config import load_config
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
    discarded: int = 0  # results whose other copy came back first
    reissued: int = 0  # the policy's count of the same


def make_policy(k: int, replicas: int, chunk: int, **kw) -> StepPolicy:
    """B = ``replicas * chunk`` groups a step, in chunks of ``chunk`` (of one group with ``stream=True``)."""
    pc = PolicyConfig(k, replicas * chunk, replicas, **kw)
    sampler = Counter(pc.chunk)
    return StepPolicy(pc, sampler.next_batch, sampler)


def stream_kw(stream: bool, slots: int) -> dict:
    """PolicyConfig's streaming fields: ``slots`` one-group calls in flight per replica, or chunk mode."""
    return {"stream": True, "slots": slots} if stream else {}


def drive(
    policy: StepPolicy,
    steps: int,
    gen: list[float],
    train: list[float],
    useful: list[float] | None = None,
    deaths: list[bool] | None = None,
    speeds: list[float] | None = None,
    changes: list[str] | None = None,
) -> Trace:
    """Run ``policy`` to ``steps`` steps in simulated time, through the loop's whole protocol (launch,
    generated, scored or failed, cancelled). Each replica has ``policy.pc.slots`` slots (a streaming replica
    runs several one-group calls at once, as the scheduler's ``idle`` lists them). Generate calls take ``gen``
    durations (cycled) over their replica's ``speeds`` (cycled; 1 by default), so they finish out of start
    order; steps take ``train``. A finished call has ``useful`` share of its groups with reward spread, or its
    replica dies instead when the next ``deaths`` draw says so: every call in flight on that replica fails with
    it. ``changes`` (cycled, one per event): "join" adds a replica, "leave" retires the slowest of two or
    more (its calls finish), "hand_back" retires it handing its calls back; "-" nothing. A retired replica is
    removed once drained. Engines are at the policy's version (a sync is part of a step). Checks after every
    event that the accounting holds and colocated never overlaps. Returns once step ``steps`` is trained,
    with calls still in flight (a checkpoint there is the scheduler's: taken right after ``on_trained``)."""
    gens, trains = itertools.cycle(gen), itertools.cycle(train)
    shares, dies = itertools.cycle(useful or [1.0]), itertools.cycle(deaths or [False])
    pace, moves = itertools.cycle(speeds or [1.0]), itertools.cycle(changes or ["-"])
    speed = {r: next(pace) for r in policy.replicas.live}
    trace, events, order = Trace(), [], itertools.count()
    idle = [r for _ in range(policy.pc.slots) for r in sorted(policy.replicas.live)]
    now, training = 0.0, False
    while policy.version < steps:
        idle = [r for r in idle if r in policy.replicas.live]
        for launch in policy.launches(idle, now):
            assert not (policy.pc.colocated and training)
            idle.remove(launch.replica)
            heapq.heappush(events, (now + next(gens) / speed[launch.replica], next(order), launch, policy.version))
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
        elif next(dies):  # the replica died mid-call: so did every other call on it
            trace.deaths += 1
            lost = [launch] + [e[2] for e in events if e[2] is not None and e[2].replica == launch.replica]
            events = [e for e in events if e[2] is None or e[2].replica != launch.replica]
            heapq.heapify(events)
            for flight in lost:
                idle.append(flight.replica)
                policy.on_failed(flight.seq, flight, now)
        else:
            idle.append(launch.replica)
            policy.on_generated(launch, now)
            kept = policy.on_scored(
                Entry(
                    launch.seq,
                    None,
                    launch.prompt_ids,
                    v0,
                    policy.version,
                    useful=round(next(shares) * len(launch.prompts)),
                ),
                launch,
            )
            trace.discarded += not kept
        change(policy, next(moves), idle, speed, next(pace))
        for flight in policy.take_cancelled(now):  # losing copies, handed-back calls: their events are void
            events = [e for e in events if e[2] is not flight]
            heapq.heapify(events)
            idle.append(flight.replica)
        policy.check_accounting()
    trace.reissued = policy.reissued
    return trace


def change(policy: StepPolicy, move: str, idle: list[int], speed: dict[int, float], pace: float) -> None:
    """One membership event of ``drive``, then every retired replica that drained is removed."""
    serving = policy.replicas.serving()
    if move == "join" and len(policy.replicas.live) < 4:
        r = policy.replicas.join()
        speed[r] = pace
        idle += [r] * policy.pc.slots
    elif move in ("leave", "hand_back") and len(serving) > 1:
        policy.retire(policy.replicas.slowest(serving), hand_back=move == "hand_back")
    for r in list(policy.replicas.draining):
        if policy.drained(r):
            policy.replicas.remove(r)


times = st.lists(st.floats(0.01, 10.0), min_size=1, max_size=7)


@settings(max_examples=200, deadline=None)
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
    stream=st.booleans(),
    slots=st.integers(1, 6),
)
def test_staleness_bound_never_violated_and_every_group_trained_once(
    k, replicas, chunk, steps, gen, train, deaths, colocated, capacity, stream, slots
):
    """Whatever the speeds, replica deaths (its chunks regenerated under their seqs), colocation, buffer
    capacity (in steps' worth of groups) or streaming (one-group calls, ``slots`` of them in flight per
    replica, finishing out of order): staleness <= k, full steps of B groups in start order, none twice."""
    B = replicas * chunk
    kw = stream_kw(stream, slots)
    policy = make_policy(k, replicas, chunk, colocated=colocated, capacity=capacity and capacity * B, **kw)
    trace = drive(policy, steps, gen, train, deaths=[*deaths, False])  # a call that always dies never ends
    assert max(trace.stale) <= k
    assert [drawn for _, drawn in trace.taken] == [B] * steps  # every step exactly B groups
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
    stream=st.booleans(),
    slots=st.integers(1, 4),
)
def test_dynamic_sampling_refills_every_step_within_the_staleness_bound(
    k, replicas, chunk, steps, gen, train, useful, cap, stream, slots
):
    """DAPO refill: calls whose groups lack reward spread free admission for more prompts; every step
    still gets B useful groups (or the run stops at the cap), in start order, never staler than k; in
    chunks or streaming one group a call."""
    B = replicas * chunk
    policy = make_policy(k, replicas, chunk, refill=True, max_sampling_batches=cap or 0, **stream_kw(stream, slots))
    calls = policy.chunk  # groups a call
    useful = useful if any(round(u * calls) for u in useful) else [*useful, 1.0]  # else nothing ever fills
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


@settings(max_examples=200, deadline=None)
@given(
    k=st.integers(0, 3),
    replicas=st.integers(1, 3),
    chunk=st.integers(1, 3),
    runs=st.lists(
        st.tuples(st.booleans(), st.integers(1, 3), times, times, st.lists(st.booleans(), min_size=1, max_size=4)),
        min_size=2,
        max_size=4,
    ),
    slots=st.integers(1, 6),
)
def test_resumes_train_what_an_uninterrupted_run_trains(k, replicas, chunk, runs, slots):
    """A run killed and resumed, again and again: each of ``runs`` (streaming?, steps, generate and train
    times, deaths) is a process that loads the last checkpoint (``state_dict`` after its last step, through
    JSON as ``driver.json``; calls in flight are lost with the process), trains its steps and checkpoints.
    Together they train prompts 0, 1, 2, ... in steps of B groups, as one uninterrupted run does, within the
    bound, and the accounting holds: in chunks or streaming on either side of a resume (the unfinished
    prompts regrouped into the resumed run's chunks), with replicas dying, and when a checkpoint comes
    before a resumed run has issued all the prompts it resumed with."""
    B, state, trained, taken, stale = replicas * chunk, None, [], [], []
    for stream, steps, gen, train, deaths in runs:
        policy = make_policy(k, replicas, chunk, **stream_kw(stream, slots))
        if state is not None:
            policy.load_state_dict(state)
        trace = drive(policy, policy.version + steps, gen, train, deaths=[*deaths, False])
        trained, taken, stale = trained + trace.trained, taken + trace.taken, stale + trace.stale
        state = json.loads(json.dumps({"step": policy.version, **policy.state_dict()}))
    total = sum(run[1] for run in runs)
    assert trained == list(range(total * B))  # same prompts, same order, none twice
    assert [drawn for _, drawn in taken] == [B] * total
    assert max(stale) <= k
    c = policy.counts
    assert c["trained"] == total * B and c["issued"] == c["trained"] + c["dropped"] + policy.in_flight()


def test_a_failed_chunk_is_regenerated_first_with_the_same_seq_and_prompts():
    policy = make_policy(k=0, replicas=2, chunk=1)
    first = policy.launches([0, 1])
    assert [(x.seq, x.prompt_ids) for x in first] == [(0, [0]), (1, [1])]
    policy.on_failed(0, first[0])
    (again,) = policy.launches([1, 0])  # k=0: B started, only the retry may start; replica 1 is busy
    assert (again.seq, again.replica, again.prompt_ids) == (0, 0, [0])
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


def ids(flights) -> list[tuple[int, int, list[int]]]:
    return [(x.seq, x.replica, x.prompt_ids) for x in flights]


@pytest.mark.parametrize(
    "overrides, replicas, chunk, slots",
    [
        ([], 1, 2, 1),  # grpo_tiny: B=2 on one replica, one call of 2 groups at a time
        (["rollout.stream=true"], 1, 1, 4),  # in_flight = 2 x 4 sequences = 2 groups; twice that in flight
        (["rollout.stream=true", "rollout.in_flight=12"], 1, 1, 6),  # 12 / 4 = 3 groups, x 2
        (["rollout.stream=true", "rollout.in_flight=6"], 1, 1, 2),  # 6 sequences hold 1 whole group, x 2
        (["rollout.stream=true", "rollout.num_replicas=2", "run.prompts_per_step=4"], 2, 1, 4),  # 8 per replica
    ],
)
def test_policy_config_from_the_run_config(overrides, replicas, chunk, slots):
    """``rollout.stream``: chunks of one group, ``slots`` = twice the groups ``rollout.in_flight`` holds."""
    pc = PolicyConfig.from_config(load_config("grpo_tiny", overrides), replicas)
    assert (pc.stream, pc.chunk, pc.slots) == (bool(overrides), chunk, slots)


def test_a_streaming_replica_that_dies_regenerates_every_group_it_was_running():
    """Stream, 2 replicas x 2 slots, k=1: four one-group calls start at v0 (2 steps' worth); replica 0 dies
    with two of them in flight: both start again on its slots under their seqs, with their prompts, and
    nothing new is issued (admission is full)."""
    policy = make_policy(k=1, replicas=2, chunk=1, stream=True, slots=2)
    assert policy.chunk == 1
    first = policy.launches([0, 1, 0, 1])
    assert ids(first) == [(0, 0, [0]), (1, 1, [1]), (2, 0, [2]), (3, 1, [3])]
    policy.on_failed(0), policy.on_failed(2)
    assert ids(policy.launches([0, 0])) == [(0, 0, [0]), (2, 0, [2])]
    assert policy.counts["issued"] == 4 and set(policy.generating) == {0, 1, 2, 3}
    for seq in (3, 1, 2, 0):  # they finish out of start order
        policy.on_scored(Entry(seq, None, [seq], 0, 0))
    assert [e.seq for e in policy.take_step().entries] == [0, 1]  # the step: B=2 groups in start order


def test_a_chunk_checkpoint_resumes_streaming_one_group_a_call():
    """A chunk-mode checkpoint at step 1 (k=1, one replica, B=2: chunk [2, 3] scored, [4, 5] in flight)
    resumed with ``rollout.stream`` (4 slots): the same prompts, now one group a call, then new draws."""
    policy = make_policy(k=1, replicas=1, chunk=2)
    for x in policy.launches([0]) + policy.launches([0]):
        policy.on_scored(Entry(x.seq, None, x.prompt_ids, 0, 0))
    policy.take_step(), policy.on_trained()
    assert ids(policy.launches([0])) == [(2, 0, [4, 5])]
    resumed = make_policy(k=1, replicas=1, chunk=2, stream=True, slots=4)
    resumed.load_state_dict(json.loads(json.dumps({"step": 1, **policy.state_dict()})))
    again = resumed.launches([0, 0, 0, 0])  # v1, k=1: 2 x 2 groups ahead
    assert ids(again) == [(1, 0, [2]), (2, 0, [3]), (3, 0, [4]), (4, 0, [5])]
    assert resumed.counts == policy.counts  # {issued 6, trained 2, dropped 0}
    for x in again[::-1]:
        resumed.on_scored(Entry(x.seq, None, x.prompt_ids, 1, 1))
    assert [p for e in resumed.take_step().entries for p in e.prompt_ids] == [2, 3]
    resumed.on_trained()
    assert ids(resumed.launches([0])) == [(5, 0, [6])]  # then the sampler's next prompt


def test_a_streaming_checkpoint_with_an_odd_group_out_resumes_in_whole_chunks():
    """Stream (B=2, k=1) checkpointed at step 1 with one group, [2], in flight, resumed in chunks of 2: the
    unfinished prompt is topped up from the next draw, so step 2 trains [2, 3] (B groups), not [2] + [3, 4];
    the draw's surplus [4] leads the next chunk."""
    policy = make_policy(k=1, replicas=1, chunk=2, stream=True, slots=4)
    first = policy.launches([0, 0, 0])
    for x in first[:2]:
        policy.on_scored(Entry(x.seq, None, x.prompt_ids, 0, 0))
    policy.take_step(), policy.on_trained()
    resumed = make_policy(k=1, replicas=1, chunk=2)
    resumed.load_state_dict(json.loads(json.dumps({"step": 1, **policy.state_dict()})))
    assert ids(resumed.launches([0])) == [(2, 0, [2, 3])]
    assert ids(resumed.launches([0])) == [(3, 0, [4, 5])]
    assert resumed.check_accounting().startswith("prompts: issued 6 = trained 2 + dropped 0")
