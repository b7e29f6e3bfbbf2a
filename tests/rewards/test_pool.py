"""The Ray reward pool: misbehaving rewards are contained, hangs are killed, async calls overlap, errors abort."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from relayrl.rewards import RewardError
from relayrl.rewards.pool import RewardPool
from relayrl.types import Trajectory, TrajectoryGroup
from tests.rewards.flaky import flaky, read_spans, sleepy

TIMEOUT_S = 8.0  # kills the hung reward; far above what a 0.5 s call takes on a loaded box


def group(pid: int, prompt: str, n: int = 3, **columns) -> TrajectoryGroup:
    trajs = [
        Trajectory(
            prompt_id=pid,
            sample_idx=i,
            prompt_token_ids=[1],
            completion_token_ids=[2],
            behaviour_logprobs=[-0.5],
            completion_text="x" * (i + 1),
            finish_reason="stop",
            versions=[],
        )
        for i in range(n)
    ]
    return TrajectoryGroup(pid, prompt, dict(columns), trajs)


@pytest.fixture(scope="module")
def pool(ray_session):
    pool = RewardPool.start(
        [("flaky", flaky, 1.0), ("sleepy", sleepy, 0.5)],
        timeout_s=TIMEOUT_S,
        num_workers=2,
        max_error_rate=0.6,
        cpus=1.0,
    )
    yield pool
    pool.shutdown()


def test_raising_hanging_nan_and_wrong_length_rewards_leave_scoring_alive(pool, ray_session, tmp_path):
    pidfile = str(tmp_path / "hang.pid")
    prompts = ["ok", "raise", "hang", "nan", "short", "text", "none", "ok"]
    groups = [group(i, p, pidfile=pidfile) for i, p in enumerate(prompts)]
    refs, scored = pool.score(
        [ray_session.put(groups[:4]), ray_session.put(groups[4:])],
        summarize=lambda gs: {"summary/groups": float(len(gs))},
    )
    m = scored.metrics
    assert m["reward/errors"] == 13 and m["reward/error_rate"] == pytest.approx(13 / 24)
    assert {k.split("/")[-1]: v for k, v in m.items() if k.startswith("reward/errors/")} == {
        "raised": 3,
        "timeout": 3,
        "worker_died": 0,
        "not_a_list": 3,
        "wrong_length": 3,
        "non_finite": 1,
        "not_a_number": 0,
    }
    assert m["reward/dropped_groups"] == 4 and m["summary/groups"] == 8
    scored = [g for ref in refs for g in ray_session.get(ref)]
    reasons = [[t.excluded.reason if t.excluded else None for t in g.trajectories] for g in scored]
    assert reasons[2] == ["timeout"] * 3 and reasons[3] == ["non_finite", None, None] and reasons[0] == [None] * 3
    # ok: len 1, 2, 3 + 0.5 * 1; none: flaky does not apply, so only 0.5 * sleepy
    assert [t.reward for t in scored[0].trajectories] == [1.5, 2.5, 3.5]
    assert [t.reward for t in scored[6].trajectories] == [0.5, 0.5, 0.5]
    _assert_dead(int(Path(pidfile).read_text()))

    refs, scored = pool.score([[group(i, "ok") for i in range(4)]])  # the pool still works afterwards
    errors = {k: v for k, v in scored.metrics.items() if k.startswith("reward/errors/") and v}
    assert scored.metrics["reward/errors"] == 0, errors
    assert scored.metrics["reward/mean"] == pytest.approx(2.5)
    # typed fields for control: every "ok" group's rewards vary (1.5, 2.5, 3.5); no token has a span
    assert (scored.useful, scored.min_version, scored.max_version) == (4, 0, 0)


def _assert_dead(pid: int) -> None:
    """The hung reward's process was killed, not left spinning in a thread."""
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"process {pid} running the hung reward is still alive")


@pytest.fixture(scope="module")
def patient_pool(ray_session):
    """A pool whose per-call timeout no busy machine reaches: this test is about overlap, not timeouts."""
    pool = RewardPool.start([("sleepy", sleepy, 1.0)], timeout_s=600.0, num_workers=2, cpus=1.0)
    yield pool
    pool.shutdown()


def test_async_rewards_overlap_in_the_pool(patient_pool, tmp_path):
    """Two async calls on one worker process ran at the same time: one started before the other ended.

    Run one after another, every call would end before the next started on that process, however fast or
    slow the machine; so the test proves concurrency without comparing a duration with a number.
    """
    spans = str(tmp_path / "spans")
    m = patient_pool.score([[group(i, "ok", spans=spans) for i in range(8)]])[1].metrics
    assert m["reward/sleepy"] == 1.0 and m["reward/errors"] == 0
    calls = read_spans(spans)
    assert len(calls) == 8
    by_pid = {pid: sorted((s, e) for p, s, e in calls if p == pid) for pid, _, _ in calls}
    overlapping = [pid for pid, ss in by_pid.items() if any(b[0] < a[1] for a, b in itertools.pairwise(ss))]
    assert overlapping, f"no two async calls overlapped on any worker: {by_pid}"


def test_error_rate_above_limit_aborts_the_step_in_one_line(pool):
    groups = [group(0, "raise"), group(1, "raise"), group(2, "ok")]  # 6 of 9 = 67% > 60%
    with pytest.raises(RewardError) as info:
        pool.score([groups])
    assert str(info.value).startswith(
        "rewards failed on 6 of 9 completions (67% > reward.max_error_rate=0.6); "
        "first: reward 'flaky' raised: raised KeyError: 'answer'"
    )
    assert "\n" not in str(info.value)


def test_unpicklable_reward_fails_at_start(ray_session):
    import threading

    lock = threading.Lock()

    def holds_a_lock(prompts, completions, **_):
        with lock:
            return [0.0] * len(completions)

    with pytest.raises(Exception, match="lock"):
        RewardPool.start([("locked", holds_a_lock, 1.0)], num_workers=1)


def test_ready_twice_returns_once_the_workers_run(pool):
    """``RewardPool.start`` already waited for the workers; asking again must not read as a failed start."""
    assert pool.result(pool.scorer.ready.remote()) is True
    refs, scored = pool.score([[group(0, "ok")]])
    assert len(refs) == 1 and scored.metrics
