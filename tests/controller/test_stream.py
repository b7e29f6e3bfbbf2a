"""``rollout.stream`` end to end (tiny model, real vLLM, Ray, FSDP2, weight sync): one async run (k = 1) of
one-group calls, several in flight on the replica, whose engine is SIGKILLed after step 3, right after the
scheduler starts two new calls on it. The run must keep what chunks keep: the staleness bound, syncs landing
in flight (per-token version spans), every schema metric, the prompt accounting, and - the replica replaced
once, each lost call generated again under its seq - exactly the prompts an uninterrupted run trains.

The loop runs in this process (``train``), so the test watches the scheduler and the policy through thin
wrappers around their methods; it decides nothing for them.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest
import ray

from relayrl.controller.policy import StepPolicy
from relayrl.controller.scheduler import Scheduler
from relayrl.monitor.schema import schema_gaps
from relayrl.rollout.cleanup import owned
from tests.controller.tiny_run import ASYNC, TinyRun, train_tiny

pytestmark = pytest.mark.slow
# The random tiny model seldom stops before max_tokens: at 128 a group generates for several times as long as a
# step trains and syncs, so syncs land while groups generate (at 16 they often finish first).
STREAM = ("rollout.stream=true", "rollout.max_tokens=128")


@dataclass
class Watch:
    """What the wrappers saw."""

    scheduler: Any = None
    killed: dict[int, list[int]] = field(default_factory=dict)  # seq -> prompt ids generating when killed
    failed: list[int] = field(default_factory=list)  # seqs the policy was told failed
    again: dict[int, list[int]] = field(default_factory=dict)  # seq -> prompt ids of its second launch
    scored: list[tuple[int, int, int, list]] = field(default_factory=list)  # seq, min/max version, groups


def engine_cores(actor_pid: int) -> list[psutil.Process]:
    """The vLLM EngineCore of the rollout actor ``actor_pid``: below it, or forked from a server for it."""
    procs = owned(actor_pid) + psutil.Process(actor_pid).children(recursive=True)
    return [p for p in procs if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline())]


@contextlib.contextmanager
def watching(watch: Watch):
    launch, launches = Scheduler._launch, StepPolicy.launches
    on_failed, on_scored = StepPolicy.on_failed, StepPolicy.on_scored

    def launch_then_kill(self: Scheduler) -> None:
        """After the third sync, once a launch put two new calls on replica 0: SIGKILL its engine. Not earlier:
        groups 4 and 5 start at v1 and generate while step 2 trains and syncs (the spans checked below); step 3
        trains them, then the kill takes groups 6 and 7 (step 4's, begun at v2) and the two just started."""
        before = set(self.generate_calls)
        launch(self)
        new = [f for ref, f in self.generate_calls.items() if ref not in before and f.replica == 0]
        watch.scheduler = self
        if watch.killed or self.policy.version < 3 or len(new) < 2:
            return
        watch.killed = {f.seq: f.prompt_ids for f in self.generate_calls.values() if f.replica == 0}
        (engine,) = engine_cores(self.system.procs[0][1])
        os.kill(engine.pid, signal.SIGKILL)

    def launches_seen(self: StepPolicy, idle: list[int], now: float = 0.0):
        out = launches(self, idle, now)
        watch.again |= {f.seq: f.prompt_ids for f in out if f.seq in watch.failed}
        return out

    def failed_seen(self: StepPolicy, seq: int, flight=None, now: float = 0.0) -> None:
        watch.failed.append(seq)
        on_failed(self, seq, flight, now)

    def scored_seen(self: StepPolicy, entry, flight=None) -> bool:
        if kept := on_scored(self, entry, flight):  # a straggler's losing copy is not the chunk's result
            watch.scored.append((entry.seq, entry.min_version, entry.max_version, ray.get(entry.ref)))
        return kept

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "_launch", launch_then_kill)
        mp.setattr(StepPolicy, "launches", launches_seen)
        mp.setattr(StepPolicy, "on_failed", failed_seen)
        mp.setattr(StepPolicy, "on_scored", scored_seen)
        yield


@pytest.fixture(scope="module")
def stream_run(ray_session, tiny_llama, tmp_path_factory) -> tuple[TinyRun, Watch]:
    watch = Watch()
    with watching(watch):
        run = train_tiny(tiny_llama, tmp_path_factory.mktemp("stream"), [*ASYNC, *STREAM])
    return run, watch


def test_streaming_keeps_the_bound_and_the_accounting(stream_run):
    run, watch = stream_run
    rows, policy = run.rows, watch.scheduler.policy
    assert (run.cfg.rollout.in_flight, policy.pc.chunk, policy.pc.slots) == (8, 1, 4)  # 2 groups run, 4 sent
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["staleness/max"] <= 1 and r["weightsync/version"] == r["step"]
        assert r["rollout/min_version"] >= r["step"] - 2  # trained at v = step - 1, k = 1
        assert r["rollout/calls"] == 2  # one call a group, B = 2
        assert 0 <= r["rollout/occupancy"] <= 1  # the engine never ran more than max_num_seqs = in_flight
        assert 0.0 <= r["idle/rollout"] <= 1.0
    # a step whose window saw no replacement counts its engine's steps (a dead engine's are lost with it)
    calm = [
        r for r, before in zip(rows, [0.0, *(r["rollout/restarts"] for r in rows)]) if r["rollout/restarts"] == before
    ]
    assert len(calm) >= 2 and all(r["rollout/occupancy"] > 0 and r["rollout/engine_steps"] > 0 for r in calm)
    # 4 groups (16 sequences) started at once on an engine that runs 8: the rest waited in it
    assert rows[0]["rollout/waiting"] > 0
    c = policy.counts
    assert c["trained"] == 8 and c["issued"] == c["trained"] + c["dropped"] + policy.in_flight()
    assert rows[-1]["accounting/trained"] == 8 and rows[-1]["accounting/issued"] == c["issued"]


def test_syncs_land_in_flight_and_the_tokens_say_which_weights_made_them(stream_run):
    """A group is a call: its versions are its own. Some group was generating when a sync landed, and every
    completion's spans cover its tokens in order, each span newer than the last, within the group's range."""
    _, watch = stream_run
    assert any(low < high for _, low, high, _ in watch.scored), [s[:3] for s in watch.scored]
    spans = [t.versions for *_, groups in watch.scored for g in groups for t in g.trajectories]
    assert any(len(s) >= 2 for s in spans)  # a completion begun on one version and finished on the next
    for _, low, high, groups in watch.scored:
        (group,) = groups
        for t in group.trajectories:
            assert t.versions[0].start == 0 and t.versions[-1].end == len(t.completion_token_ids)
            assert all(a.end == b.start and a.version < b.version for a, b in zip(t.versions, t.versions[1:]))
            assert low <= t.versions[0].version and t.versions[-1].version <= high


def test_streaming_logs_every_schema_metric_and_nothing_else(stream_run):
    run, _ = stream_run
    undocumented, missing = schema_gaps({k for r in run.rows for k in r}, {"async", "first_sync", "first_step", "push"})
    assert undocumented == [] and missing == []


def test_an_engine_killed_with_calls_in_flight_is_replaced_once_and_the_run_trains_the_same_prompts(
    stream_run, async_run
):
    """Every call generating on the replica when its engine died failed and started again under its seq with
    the same prompts; one replacement served them all; the run trained what an uninterrupted run trains."""
    run, watch = stream_run
    seen = (watch.killed, watch.failed, watch.again)
    assert len(watch.killed) >= 2, seen  # the two calls just started, and any still running
    assert set(watch.failed) <= set(watch.killed) and len(watch.failed) >= 2, seen
    assert len(watch.failed) == len(set(watch.failed)), seen  # each failed once
    assert watch.again == {seq: watch.killed[seq] for seq in watch.failed}, seen
    assert run.rows[-1]["rollout/restarts"] == 1
    assert run.prompts == async_run.prompts and len(run.prompts) == 4
