"""Replica recovery decisions without engines: which failures are deaths (real Ray actors on CPU), and the
restart loop's retries and backoff (``System._recreate_rollout`` faked; sleeps recorded, not waited)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import ray

import relayrl.controller.system as system_module
from relayrl.controller.faults import task_error_line
from relayrl.controller.replicas import is_death, restart_backoff_s
from relayrl.controller.system import System


class Replica:
    """A rollout-actor stand-in: answers ``weight_version``; ``generate`` raises a task's own error."""

    def weight_version(self) -> int:
        return 3

    def generate(self) -> None:
        raise ValueError("calculator env: cannot parse '2 +'")


def failure(ref: ray.ObjectRef) -> BaseException:
    with pytest.raises(ray.exceptions.RayError) as info:
        ray.get(ref)
    return info.value


def test_a_task_error_on_a_live_replica_is_not_a_death_and_reads_as_one_line(ray_session):
    # Any: Ray's overloads read a class with no __init__ as a function (its handle would lack .remote)
    actor: Any = ray.remote(Replica).options(num_cpus=0).remote()
    error = failure(actor.generate.remote())
    assert isinstance(error, ray.exceptions.RayTaskError) and not is_death(error, actor)
    line = task_error_line(0, error)
    assert "\n" not in line and "ValueError: calculator env: cannot parse '2 +'" in line
    ray.kill(actor, no_restart=True)
    dead = after_kill(actor)
    assert isinstance(dead, ray.exceptions.RayActorError) and is_death(dead, actor)


def after_kill(actor, calls: int = 50) -> BaseException:
    """The error of the first ``generate`` after ``ray.kill`` lands: the kill is asynchronous, so a call
    sent right after it may still run on the live actor and fail with its own task error (seen once in
    CI); at most ``calls`` calls, then the last error, whatever it is."""
    for _ in range(calls):
        error = failure(actor.generate.remote())
        if isinstance(error, ray.exceptions.RayActorError):
            break
    return error


def fake_system(max_restarts: int, failures: int, monkeypatch) -> tuple[System, list[float]]:
    """A System whose first ``failures`` re-creations die while starting (the replacement never answers)."""
    sleeps: list[float] = []
    monkeypatch.setattr(system_module.time, "sleep", sleeps.append)
    monkeypatch.setattr(system_module, "answers", lambda rollout, timeout_s=30.0: False)
    cfg: Any = SimpleNamespace(rollout=SimpleNamespace(max_restarts=max_restarts))  # the fields System reads
    system = System(cfg, None, ["replica0"], None, None)
    attempts = iter(range(100))

    def recreate(i: int, version: int) -> None:
        if next(attempts) < failures:
            raise ray.exceptions.ActorDiedError()

    monkeypatch.setattr(system, "_recreate_rollout", recreate)
    return system, sleeps


def test_a_replacement_that_dies_while_starting_is_another_attempt_with_backoff(monkeypatch):
    system, sleeps = fake_system(max_restarts=5, failures=3, monkeypatch=monkeypatch)
    system.restart_rollout(0, version=2, error=RuntimeError("EngineDeadError"))
    assert system.restarts == 4 and sleeps == [1.0, 2.0, 4.0]  # every attempt counts


def test_restarts_stop_at_max_restarts_naming_the_last_error(monkeypatch):
    system, sleeps = fake_system(max_restarts=2, failures=10, monkeypatch=monkeypatch)
    with pytest.raises(RuntimeError, match=r"replica 0 died again after 2 restarts \(rollout.max_restarts\)"):
        system.restart_rollout(0, version=2, error=RuntimeError("EngineDeadError"))
    assert system.restarts == 2 and sleeps == [1.0]


def test_backoff_doubles_and_is_capped():
    assert [restart_backoff_s(a) for a in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


class Scorer:
    """A rollout-actor stand-in for the post-sync probe: token t scores -t/100, plus ``shift``."""

    def __init__(self, shift: float = 0.0) -> None:
        self.shift = shift

    def weight_version(self) -> int:
        return 10

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        if not token_ids:
            raise ValueError("empty prompt")
        return [-t / 100 + self.shift for t in token_ids[1:]]


def scorer(shift: float = 0.0):
    return ray.remote(Scorer).options(num_cpus=0).remote(shift)


def dead_scorer():
    """A stand-in that was killed, once calls to it fail (``ray.kill`` lands asynchronously)."""
    actor = scorer()
    ray.get(actor.weight_version.remote())
    ray.kill(actor, no_restart=True)
    for _ in range(100):
        try:
            ray.get(actor.weight_version.remote())
        except ray.exceptions.RayActorError:
            return actor
    raise AssertionError("the killed stand-in still answers")


def probe_system(rollouts: list, monkeypatch) -> tuple[System, list[tuple[int, int]]]:
    """A System over ``rollouts`` whose re-creation puts a fresh, exact ``Scorer`` in the dead one's place."""
    ws = SimpleNamespace(max_mismatch=0.05, pull_when="sync")
    cfg: Any = SimpleNamespace(rollout=SimpleNamespace(max_restarts=3), weightsync=ws)
    system = System(cfg, None, rollouts, None, None)
    recreated: list[tuple[int, int]] = []

    def recreate(i: int, version: int) -> None:
        recreated.append((i, version))
        system.rollouts[i] = scorer()

    monkeypatch.setattr(system, "_recreate_rollout", recreate)
    return system, recreated


SEQS = [[5, 7, 9], [4, 6, 8], [1, 2, 3]]  # replica i % 2 scores sequence i
TRAINER = [[-0.07, -0.09], [-0.06, -0.08], [-0.02, -0.03]]
STARTS = [0, 1, 0]  # completion logprobs: 2 + 1 + 2 tokens


def test_a_replica_that_dies_during_the_probe_is_replaced_at_the_version_and_asked_again(ray_session, monkeypatch):
    from relayrl.monitor.schema import MISMATCH_MAX_ABS, MISMATCH_TOKENS

    system, recreated = probe_system([scorer(), dead_scorer()], monkeypatch)
    stats = system.check_mismatch(10, (SEQS, STARTS, TRAINER))
    assert recreated == [(1, 10)] and system.restarts == 1
    assert stats[MISMATCH_TOKENS] == 5 and stats[MISMATCH_MAX_ABS] < 1e-12


def test_a_probe_error_or_mismatch_on_live_replicas_stops_the_run_without_restarts(ray_session, monkeypatch):
    from relayrl.weightsync.client import WeightSyncError

    system, recreated = probe_system([scorer(), scorer(shift=0.5)], monkeypatch)
    with pytest.raises(WeightSyncError, match=r"after sync v10 engine and trainer logprobs differ by 0\.1 "):
        system.check_mismatch(10, (SEQS, STARTS, TRAINER))  # replica 1's one token 0.5 off: 0.5 / 5 tokens
    with pytest.raises(ray.exceptions.RayTaskError, match="empty prompt"):
        system.check_mismatch(10, ([[5, 7, 9], []], [0, 0], [[-0.07, -0.09], []]))
    assert recreated == [] and system.restarts == 0
