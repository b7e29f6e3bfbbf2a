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
    assert not buf.ready(2)                      # entry 0 started first and has not arrived
    buf.put(entry(0, 0))
    assert buf.ready(4) and not buf.ready(6)
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
    dropping.put(entry(1, 2))
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


def simulate(k: int, replicas: int, chunk: int, steps: int, gen_times: list[float], train_times: list[float]):
    """Returns (staleness of every trained group, prompt ids trained in order, prompts started)."""
    B = replicas * chunk
    adm, buf = Admission(k, B), ReplayBuffer(k)
    events, now, version, idle = [], 0.0, 0, list(range(replicas))
    training, trained, stale, started, draws = False, [], [], [], iter(gen_times * 1000)
    tdraws = iter(train_times * 1000)
    while version < steps:
        while idle and adm.allows(version, chunk):            # Scheduler._admit
            r, seq = idle.pop(0), adm.started // chunk
            prompts = list(range(adm.started, adm.started + chunk))
            adm.start(chunk)
            started += prompts
            heapq.heappush(events, (now + next(draws), "gen", seq, r, version, prompts))
        if not training and buf.ready(B):                       # Scheduler._start_training
            taken = buf.take(version, B)
            stale += [version - e.min_version for e in taken for _ in e.prompt_ids]
            trained += [p for e in taken for p in e.prompt_ids]
            training = True
            heapq.heappush(events, (now + next(tdraws), "train", 0, 0, 0, []))
        now, kind, seq, r, v0, prompts = heapq.heappop(events)
        if kind == "gen":
            idle.append(r)
            buf.put(Entry(seq, None, prompts, v0, version))
        else:
            training, version = False, version + 1              # train + sync: engines now at v+1
    return stale, trained, started


@settings(max_examples=150, deadline=None)
@given(k=st.integers(0, 3), replicas=st.integers(1, 3), chunk=st.integers(1, 3), steps=st.integers(1, 8),
       gen=st.lists(st.floats(0.01, 10.0), min_size=1, max_size=7),
       train=st.lists(st.floats(0.01, 10.0), min_size=1, max_size=5))
def test_staleness_bound_never_violated_and_every_group_trained_once(k, replicas, chunk, steps, gen, train):
    stale, trained, started = simulate(k, replicas, chunk, steps, gen, train)
    assert max(stale) <= k
    assert len(trained) == len(set(trained)) == steps * replicas * chunk     # none twice, a full batch per step
    assert trained == started[: len(trained)]                               # in start order, none skipped
    if k == 0:
        assert set(stale) == {0}                                            # sync mode: strictly on-policy
