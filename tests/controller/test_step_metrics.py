"""A step's metrics from its generate calls: each combined by the reduction its schema entry carries."""

from __future__ import annotations

import pytest

from relayrl.controller.buffer import Entry
from relayrl.controller.steplog import Clock, age_s, mean_metrics, seconds_since_launch
from relayrl.monitor.schema import REDUCTIONS, SCHEMA, reduction


def test_calls_combine_by_their_schema_reduction():
    a = Entry(
        0,
        None,
        [0, 1],
        2,
        3,
        {
            "reward/mean": 1.0,
            "rollout/tokens": 30,
            "reward/errors/timeout": 1,
            "rollout/min_version": 2,
            "rollout/max_version": 3,
        },
    )
    b = Entry(
        1,
        None,
        [2, 3, 4, 5],
        1,
        2,
        {"reward/mean": 0.25, "rollout/tokens": 50, "rollout/min_version": 1, "rollout/max_version": 2},
    )
    out = mean_metrics([a, b])
    assert out["reward/mean"] == pytest.approx((1.0 * 2 + 0.25 * 4) / 6)  # group-weighted: 0.5
    assert out["rollout/tokens"] == 80 and out["reward/errors/timeout"] == 1
    assert out["rollout/min_version"] == 1 and out["rollout/max_version"] == 3


def test_every_schema_reduction_is_known_and_counts_are_summed():
    assert {m.reduce for m in SCHEMA} <= set(REDUCTIONS)
    assert reduction("rollout/completions") == "sum" and reduction("reward/errors/raised") == "sum"
    assert reduction("reward/std") == "mean" and reduction("not/a_metric") == "mean"


def test_the_policy_entry_reads_the_typed_fields_not_the_metric_keys():
    """scored_entry takes versions and useful groups from Scored's fields; metrics ride along for logs."""
    from relayrl.controller.policy import Flight
    from relayrl.controller.scheduler import scored_entry
    from relayrl.data import Prompt
    from relayrl.rewards.scoring import Scored

    metrics = {"rollout/min_version": 9.0, "rollout/max_version": 9.0, "reward/spread_groups": 9.0}
    entry = scored_entry(Flight(3, 0, [Prompt(5, "p5"), Prompt(6, "p6")], scored="ref"), Scored(1, 2, 4, metrics))
    assert (entry.seq, entry.ref, entry.prompt_ids) == (3, "ref", [5, 6])
    assert (entry.min_version, entry.max_version, entry.useful, entry.metrics) == (2, 4, 1, metrics)


def busy(calls: list[tuple[int, float, float]], start: float = 10.0) -> float:
    """Replica-seconds a window opened at ``start`` credits for ``calls`` (replica, t0, t1), reported in order."""
    clock = Clock(start=start)
    for replica, t0, t1 in calls:
        clock.generated(replica, t0, t1)
    return clock.rollout_busy


def test_overlapping_calls_on_one_replica_count_once():
    """Streaming keeps several calls in flight on a replica: its busy time is their union, [10, 16] = 6 s,
    not the sum 4 + 4 + 1 = 9 s; whatever order the calls are reported in."""
    calls = [(0, 10.0, 14.0), (0, 12.0, 16.0), (0, 13.0, 14.0)]
    assert busy(calls) == 6.0
    assert busy(calls[::-1]) == 6.0


def test_a_long_call_covers_the_gap_between_short_ones_that_ended_first():
    """Calls reported as they end: [10, 11] and [12, 13] leave a gap that [10, 15], reported last, covers:
    the replica was busy all 5 s (crediting only past the last end seen would give 1 + 1 + 2 = 4)."""
    assert busy([(0, 10.0, 11.0), (0, 12.0, 13.0), (0, 10.0, 15.0)]) == 5.0
    assert busy([(0, 10.0, 11.0), (0, 12.0, 13.0)]) == 2.0  # the gap alone is idle


def test_calls_on_two_replicas_count_separately():
    assert busy([(0, 10.0, 14.0), (1, 12.0, 16.0)]) == 8.0  # 4 + 4 replica-seconds, though they overlap


def test_only_the_part_inside_the_window_counts():
    """The window opened at 10: a call from 5 to 12 counts 2 s, one that ended at 8 nothing (never < 0);
    then [9, 11] on the same replica adds nothing that [5, 12] did not already cover."""
    assert busy([(0, 5.0, 12.0)]) == 2.0
    assert busy([(0, 5.0, 8.0)]) == 0.0
    assert busy([(0, 5.0, 12.0), (0, 9.0, 11.0), (1, 9.0, 11.0)]) == 3.0  # 2 + replica 1's 1 s


def test_age_from_boot_clock_and_start_ticks():
    # started 99 000 ticks of 1/100 s after boot (990 s), asked 1000.25 s after boot: 10.25 s old
    assert age_s(1000.25, 99_000, 100) == pytest.approx(10.25)
    assert age_s(990.0, 99_000, 100) == 0.0


def test_launch_age_is_exact_where_psutils_reads_up_to_a_second_long():
    """psutil's create_time uses /proc/stat's boot time, whole seconds rounded down: its age of this process
    is ours plus the boot time's fraction (0 to 1 s), give or take a 10 ms tick."""
    import time

    import psutil

    ours = seconds_since_launch()
    theirs = time.time() - psutil.Process().create_time()
    assert ours > 0
    assert -0.02 <= theirs - ours < 1.02
