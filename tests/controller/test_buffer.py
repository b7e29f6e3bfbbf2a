"""Replay buffer + admission control: the staleness bound holds whatever the speeds; nothing lost or repeated.

``simulate`` runs the scheduler's rules (``Scheduler._admit`` / ``_start_training``) as a discrete-event
simulation: replicas generate for random durations, the trainer trains for random durations, a sync
bumps the engine version right after each step.
"""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.controller.buffer import Admission, Entry, ReplayBuffer, StalenessError, staleness_histogram


def entry(seq: int, version: int, groups: int = 2) -> Entry:
    return Entry(seq, f"ref{seq}", list(range(seq * groups, (seq + 1) * groups)), version, version)


def test_take_follows_start_order_and_waits_for_the_next_in_line():
    buf = ReplayBuffer(max_staleness=1)
    buf.put(entry(1, 0))
    assert not buf.ready(0, 2)                      # entry 0 started first and has not arrived
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
    assert not dropping.ready(2, 2)                 # entry 0 would be dropped and nothing follows yet
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


def simulate(k: int, replicas: int, chunk: int, steps: int, gen_times: list[float], train_times: list[float],
             useful: list[float] | None = None, max_groups: int | None = None):
    """Returns (staleness of every trained group, prompt ids trained in order, prompts started, per step
    (useful groups, groups) taken). ``useful``: with dynamic sampling, the share of each finished call's
    groups whose rewards vary (drawn in turn), ``max_groups`` the cap on a step's groups."""
    B = replicas * chunk
    adm, buf = Admission(k, B), ReplayBuffer(k)
    events, now, version, idle, seq = [], 0.0, 0, list(range(replicas)), 0
    training, trained, stale, started, steps_taken = False, [], [], [], []
    draws, tdraws, udraws = iter(gen_times * 1000), iter(train_times * 1000), iter((useful or [1.0]) * 1000)
    while version < steps:
        while idle and adm.allows(version, chunk):            # Scheduler._admit
            r, seq = idle.pop(0), seq + 1
            prompts = list(range(adm.started, adm.started + chunk))
            adm.start(chunk)
            started += prompts
            heapq.heappush(events, (now + next(draws), "gen", seq - 1, r, version, prompts))
        if not training and buf.ready(version, B, max_groups):           # Scheduler._start_training
            taken = buf.take(version, B, max_groups)
            steps_taken.append((sum(e.counted for e in taken), sum(e.num_groups for e in taken)))
            if steps_taken[-1][0] < B:
                break                                           # Scheduler._took: the run stops, says why
            if useful is not None:
                adm.took(steps_taken[-1][0])
            stale += [version - e.min_version for e in taken for _ in e.prompt_ids]
            trained += [p for e in taken for p in e.prompt_ids]
            training = True
            heapq.heappush(events, (now + next(tdraws), "train", 0, 0, 0, []))
        now, kind, s, r, v0, prompts = heapq.heappop(events)
        if kind == "gen":
            idle.append(r)
            e = Entry(s, None, prompts, v0, version)
            if useful is not None:                              # Scheduler._finish_generation
                e.useful = round(next(udraws) * chunk)
                adm.waste(chunk - e.useful)
            buf.put(e)
        else:
            training, version = False, version + 1              # train + sync: engines now at v+1
    return stale, trained, started, steps_taken


@settings(max_examples=150, deadline=None)
@given(k=st.integers(0, 3), replicas=st.integers(1, 3), chunk=st.integers(1, 3), steps=st.integers(1, 8),
       gen=st.lists(st.floats(0.01, 10.0), min_size=1, max_size=7),
       train=st.lists(st.floats(0.01, 10.0), min_size=1, max_size=5))
def test_staleness_bound_never_violated_and_every_group_trained_once(k, replicas, chunk, steps, gen, train):
    stale, trained, started, _ = simulate(k, replicas, chunk, steps, gen, train)
    assert max(stale) <= k
    assert len(trained) == len(set(trained)) == steps * replicas * chunk     # none twice, a full batch per step
    assert trained == started[: len(trained)]                               # in start order, none skipped
    if k == 0:
        assert set(stale) == {0}                                            # sync mode: strictly on-policy


@settings(max_examples=150, deadline=None)
@given(k=st.integers(0, 3), replicas=st.integers(1, 3), chunk=st.integers(1, 3), steps=st.integers(1, 8),
       gen=st.lists(st.floats(0.01, 10.0), min_size=1, max_size=7),
       train=st.lists(st.floats(0.01, 10.0), min_size=1, max_size=5),
       useful=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6), cap=st.sampled_from([None, 2, 10]))
def test_dynamic_sampling_refills_every_step_within_the_staleness_bound(k, replicas, chunk, steps, gen, train,
                                                                        useful, cap):
    """DAPO refill: calls whose groups lack reward spread free admission for more prompts; every step
    still gets B useful groups (or hits the cap), in start order, never staler than k."""
    B = replicas * chunk
    useful = useful if any(round(u * chunk) for u in useful) else useful + [1.0]   # else nothing ever fills
    max_groups = cap * B if cap else None
    stale, trained, started, taken = simulate(k, replicas, chunk, steps, gen, train, useful, max_groups)
    assert max(stale, default=0) <= k
    assert len(trained) == len(set(trained)) and trained == started[: len(trained)]
    assert len(taken) == steps or taken[-1][0] < B           # every step trained, or the run stopped ...
    assert all(counted >= B for counted, _ in taken[:-1])
    if taken[-1][0] < B:                                     # ... only when a step could not fill up in the cap
        assert max_groups is not None and taken[-1][1] >= max_groups


def test_useful_groups_fill_a_step_and_wasted_ones_reopen_admission():
    buf = ReplayBuffer(max_staleness=0)
    for seq, useful in enumerate([1, 0, 2]):              # calls of 2 groups: 1, 0 and 2 with reward spread
        e = entry(seq, 0)
        e.useful = useful
        buf.put(e)
    assert not buf.ready(0, 4) and buf.ready(0, 3) and buf.ready(0, 4, max_groups=6)
    assert [e.seq for e in buf.take(version=0, groups=3)] == [0, 1, 2]   # 1 + 0 + 2 = 3 useful
    adm = Admission(max_staleness=0, groups_per_step=4)
    adm.start(4)
    assert not adm.allows(version=0, chunk=2)
    adm.waste(3)                                          # 3 of the 4 groups all scored alike: 1 useful
    assert adm.allows(version=0, chunk=2)                 # 1 < 4 ahead: draw more (even past 4 in all)
    adm.start(2), adm.start(2)
    assert not adm.allows(version=0, chunk=2)             # 5 useful ahead if all in flight are
    adm.took(5)                                           # step 1 took 5 (a call is not split): surplus 1
    assert (adm.surplus, adm.allows(version=1, chunk=2)) == (1, True)   # 8 - 3 - 5 = 0 ahead


def test_a_step_that_cannot_fill_up_stops_the_run_with_the_fix():
    from types import SimpleNamespace

    from relayrl.controller.scheduler import Scheduler

    state = SimpleNamespace(B=4, version=2, admission=Admission(0, 4),
                            cfg=SimpleNamespace(algorithm=SimpleNamespace(max_sampling_batches=2)))
    e = entry(0, 2, groups=8)
    e.useful = 3
    with pytest.raises(RuntimeError, match="drew 8 groups for step 3 and only 3 of the 4 needed.*"
                                           "raise algorithm.max_sampling_batches"):
        Scheduler._took(state, [e])
    e.useful = 5
    Scheduler._took(state, [e])
    assert state.admission.surplus == 1
