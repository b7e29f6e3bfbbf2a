"""Elastic, heterogeneous replicas in the step policy: joins, leaves, work in proportion to speed, and
copies of stragglers whose first result wins. The property test drives the real ``StepPolicy`` through
``test_buffer.drive``; the others are hand-worked."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.controller.buffer import Entry
from relayrl.controller.policy import Flight, StepPolicy
from relayrl.controller.swarm import LOADS_KEPT, ReplicaSet
from tests.controller.test_buffer import drive, make_policy, stream_kw, times


def scored(policy: StepPolicy, flight: Flight, now: float = 0.0) -> bool:
    policy.on_generated(flight, now)
    return policy.on_scored(Entry(flight.seq, None, flight.prompt_ids, policy.version, policy.version), flight)


@settings(max_examples=300, deadline=None)
@given(
    k=st.integers(0, 3),
    replicas=st.integers(1, 3),
    chunk=st.integers(1, 3),
    steps=st.integers(1, 8),
    gen=times,
    train=times,
    speeds=st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0]), min_size=1, max_size=4),
    changes=st.lists(st.sampled_from(["-", "-", "-", "join", "leave", "hand_back"]), min_size=1, max_size=8),
    deaths=st.lists(st.booleans(), min_size=1, max_size=5),
    colocated=st.booleans(),
    stream=st.booleans(),
    slots=st.integers(1, 4),
)
def test_joins_leaves_and_copies_keep_the_bound_and_train_every_group_once(
    k, replicas, chunk, steps, gen, train, speeds, changes, deaths, colocated, stream, slots
):
    """Replicas of different speeds joining, leaving (draining, or handing their calls back) and dying, with
    stragglers copied to idle replicas: staleness <= k, every step B groups in start order, none twice, the
    accounting holds, and every copy that lost was counted."""
    B = replicas * chunk
    policy = make_policy(k, replicas, chunk, colocated=colocated, **stream_kw(stream, slots))
    trace = drive(policy, steps, gen, train, deaths=[*deaths, False], speeds=speeds, changes=changes)
    assert max(trace.stale) <= k
    assert [drawn for _, drawn in trace.taken] == [B] * steps
    assert trace.trained == list(range(steps * B))  # in start order, none skipped, none twice
    c = policy.counts
    assert c["trained"] == steps * B and c["issued"] == c["trained"] + c["dropped"] + policy.in_flight()
    assert trace.discarded <= policy.reissued  # a discarded result is a copy that lost (others were cancelled)
    assert policy.replicas.live  # never all gone


def test_work_goes_in_proportion_to_measured_speed():
    """Replica 0 finished 4 groups in 2 busy seconds (2/s), replica 1 2 groups in 2 s (1/s). Six chunks on
    six free slots each: (running + 1) / rate picks 0 (0.5), 0 (1.0, tie: the earlier slot), 1 (1.0), 0 (1.5),
    0 (2.0, tie), 1 (2.0 < 2.5): four and two, the 2:1 of their speeds."""
    rs = ReplicaSet.of(2)
    for r, groups in ((0, 4), (1, 2)):
        rs.started(r, 0.0)
        rs.stopped(r, 2.0, groups)
    assert rs.rates() == {0: 2.0, 1: 1.0}
    free, extra = [0] * 6 + [1] * 6, Counter()
    for _ in range(6):
        extra[free.pop(rs.pick(free, extra))] += 1
    assert extra == {0: 4, 1: 2}
    assert rs.slowest([0, 1]) == 1


def test_with_durations_at_two_loads_work_goes_where_it_finishes_first():
    """Replica 0 took 4 s for calls started at load 2 and 6 s at load 4: d = 2 + 1 x load. Replica 1, half as
    fast: 8 s and 12 s, d = 4 + 2 x load. Six chunks, none running: the finishes are 3, 4, 5, 6, 7 on replica 0
    and 6, 8 on replica 1, so 0, 0, 0, 0 (6, tie: the earlier slot), 1 (6), 0 (7): five and one, all done by 7 s.
    By throughput (2 and 1 groups a second from the same calls) it would be four and two, done by 8 s."""
    rs = ReplicaSet.of(2)
    for r, a, b in ((0, 2.0, 1.0), (1, 4.0, 2.0)):
        for load in (2, 4):
            rs.observe(r, load, a + b * load)
    assert rs.finish_model(0) == (2.0, 1.0) and rs.finish_model(1) == (4.0, 2.0)
    free, extra = [0] * 6 + [1] * 6, Counter()
    for _ in range(6):
        extra[free.pop(rs.pick(free, extra))] += 1
    assert extra == {0: 5, 1: 1}


def test_a_duration_fit_needs_two_loads_and_a_positive_slope():
    """One load, or durations that fall with the load (noise), give no fit: placement goes by throughput for
    every replica until each has one. The same load again averages with the last (2 then 6 s: 4 s), and only
    the ``LOADS_KEPT`` most recent loads stay."""
    rs = ReplicaSet.of(2)
    rs.observe(0, 3, 2.0)
    rs.observe(0, 3, 6.0)
    assert rs.durations[0] == {3: 4.0} and rs.finish_model(0) is None
    rs.observe(1, 1, 5.0)
    rs.observe(1, 2, 4.0)
    assert rs.finish_model(1) is None
    rs.observe(0, 5, 8.0)
    assert rs.finish_model(0) == (-2.0, 2.0)
    for load in range(100, 100 + LOADS_KEPT):
        rs.observe(0, load, float(load))
    assert len(rs.durations[0]) == LOADS_KEPT and 3 not in rs.durations[0] and 5 not in rs.durations[0]


def test_a_call_is_timed_at_the_load_its_launch_round_left():
    """Three chunks launched together on replica 0 all start at load 3 (they run side by side), and the one that
    ends 5 s later is recorded at load 3, not 1."""
    policy = make_policy(k=0, replicas=1, chunk=3, **stream_kw(True, 3))  # B = 3 groups, one a call
    flights = policy.launches([0, 0, 0], now=10.0)
    assert [(f.launched, f.load) for f in flights] == [(10.0, 3)] * 3
    policy.on_generated(flights[0], 15.0)
    assert policy.replicas.durations[0] == {3: 5.0}


def test_busy_time_counts_overlapping_calls_once():
    """Two calls on one replica from 0 to 4 s and 1 to 3 s: busy 4 s, not 6; 2 groups: 0.5 groups/s. A replica
    never measured takes the mean of the measured ones."""
    rs = ReplicaSet.of(2)
    rs.started(0, 0.0)
    rs.started(0, 1.0)
    rs.stopped(0, 3.0, 1)
    rs.stopped(0, 4.0, 1)
    assert rs.busy_s[0] == 4.0 and rs.rate(0) == 0.5 and rs.rate(1) == 0.5


def test_a_straggler_is_copied_to_an_idle_replica_and_the_first_result_wins():
    policy = make_policy(k=0, replicas=2, chunk=1)
    a, b = policy.launches([0, 1])
    assert scored(policy, a)  # replica 0 is done; seq 1 still generates on replica 1
    (copy,) = policy.launches([0])
    assert (copy.seq, copy.replica, copy.copy, copy.prompt_ids) == (1, 0, True, b.prompt_ids)
    assert scored(policy, copy)  # the copy came back first
    assert policy.take_cancelled() == [b] and policy.reissued == 1
    assert not policy.on_scored(Entry(1, None, b.prompt_ids, 0, 0), b)  # the original, late: discarded
    step = policy.take_step()
    assert step is not None and [e.seq for e in step.entries] == [0, 1]
    assert policy.on_trained() == [0, 1] and policy.counts["issued"] == 2


def test_a_chunk_is_no_straggler_in_the_round_that_placed_it():
    """One chunk a step and two replicas: the round that places it on replica 1 leaves replica 0 idle, without a
    copy (both would start together: a race, not a rescue); a later round, with the chunk still generating,
    copies it."""
    policy = make_policy(k=0, replicas=1, chunk=1)
    policy.replicas.join()
    (a,) = policy.launches([1, 0])
    assert a.replica == 1 and policy.copies == {}
    (copy,) = policy.launches([0])
    assert (copy.seq, copy.replica, copy.copy) == (a.seq, 0, True)


def test_no_copy_on_a_slower_replica_or_once_a_step_can_fill():
    policy = make_policy(k=0, replicas=2, chunk=1)
    a, _ = policy.launches([0, 1])
    policy.replicas.groups.update({0: 1, 1: 4})
    policy.replicas.busy_s.update({0: 4.0, 1: 4.0})  # replica 0 at 0.25 groups/s, replica 1 at 1
    assert scored(policy, a, 1.0)
    assert policy.launches([0]) == []  # copying replica 1's chunk to a slower one would not help
    fill = make_policy(k=0, replicas=2, chunk=1)
    a, b = fill.launches([0, 1])
    assert scored(fill, b) and scored(fill, a)
    assert fill.launches([0, 1]) == []  # the step can fill: nothing to copy


def test_a_failed_original_leaves_its_copy_as_the_chunks_call():
    policy = make_policy(k=0, replicas=2, chunk=1)
    a, b = policy.launches([0, 1])
    assert scored(policy, a)
    (copy,) = policy.launches([0])
    policy.on_failed(b.seq, b)  # replica 1 died: no retry, the copy carries on
    assert policy.retry == [] and policy.generating[1] is copy and not copy.copy
    assert scored(policy, copy) and policy.reissued == 0


def test_a_leaving_replica_hands_its_chunks_back_under_their_seqs():
    policy = make_policy(k=0, replicas=2, chunk=1)
    a, b = policy.launches([0, 1])
    policy.retire(1, hand_back=True)
    assert policy.take_cancelled() == [b] and policy.retry == [1] and policy.drained(1)
    policy.replicas.remove(1)
    assert scored(policy, a)
    (again,) = policy.launches([0, 1])  # replica 1's slot is passed over: it left
    assert (again.seq, again.replica, again.prompt_ids) == (1, 0, b.prompt_ids)
    assert scored(policy, again)
    assert policy.take_step() is not None and policy.on_trained() == [0, 1]
    assert policy.counts["issued"] == 2  # handed back, not issued again


def test_a_draining_replica_finishes_what_it_runs_and_takes_nothing_new():
    policy = make_policy(k=1, replicas=2, chunk=1)
    _, b = policy.launches([0, 1])
    policy.retire(1)
    assert not policy.drained(1) and policy.take_cancelled() == []
    assert all(f.replica == 0 for f in policy.launches([0, 1]))  # k=1: room for more, none on replica 1
    assert scored(policy, b) and policy.drained(1)
    joined = policy.replicas.join()
    assert joined == 2 and policy.replicas.serving() == [0, 2]
