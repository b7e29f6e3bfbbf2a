"""A step's metrics from its generate calls: each combined by the reduction its schema entry carries."""

from __future__ import annotations

import pytest

from relayrl.controller.buffer import Entry
from relayrl.controller.steplog import age_s, mean_metrics, seconds_since_launch
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
