"""``rollout.pause_while_training`` end to end (tiny model, real vLLM, Ray, FSDP2, weight sync): an async
streaming run (k = 1) whose engines pause while each step trains. While paused an engine runs no step, though
calls are in flight on it; their frozen sequences go on afterwards under the new weights (version spans), and
the run trains exactly the prompts an uninterrupted chunked run trains, with the accounting intact.

The loop runs in this process, so the test watches ``System.pause_rollouts`` through a thin wrapper.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import pytest
import ray

from relayrl.controller.system import System
from relayrl.monitor.schema import schema_gaps
from tests.controller.tiny_run import ASYNC, TinyRun, train_tiny

pytestmark = pytest.mark.slow
TURNS = ("rollout.stream=true", "rollout.max_tokens=128", "rollout.pause_while_training=true")


@dataclass
class Pauses:
    """Per pause: engine steps run while it held."""

    steps_while_paused: list[float] = field(default_factory=list)
    resumes: int = 0


@contextlib.contextmanager
def watching(pauses: Pauses):
    original = System.pause_rollouts

    def pause_rollouts(self: System, pause: bool = True) -> None:
        if pause:
            original(self, True)
            time.sleep(0.2)  # outputs of the step that ran as the pause began may still arrive
            ray.get([r.occupancy.remote() for r in self.rollouts])  # counters from here on: the paused window
            return
        replies = ray.get([r.occupancy.remote() for r in self.rollouts])
        pauses.steps_while_paused.append(sum(r["steps"] for r in replies))
        pauses.resumes += 1
        original(self, False)

    System.pause_rollouts = pause_rollouts  # type: ignore[method-assign]
    try:
        yield
    finally:
        System.pause_rollouts = original  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def turns_run(ray_session, tiny_llama, tmp_path_factory) -> tuple[TinyRun, Pauses]:
    pauses = Pauses()
    with watching(pauses):
        run = train_tiny(tiny_llama, tmp_path_factory.mktemp("turns"), [*ASYNC, *TURNS])
    return run, pauses


def test_engines_run_no_step_while_a_step_trains(turns_run):
    run, pauses = turns_run
    assert pauses.resumes == len(run.rows) == 4  # paused and resumed around every step's training
    assert pauses.steps_while_paused == [0.0] * 4
    # not vacuous: groups were generating across a step (their tokens span a sync, so they were in flight when
    # the engines paused for it)
    assert any(r["rollout/min_version"] < r["rollout/max_version"] for r in run.rows)


def test_frozen_sequences_carry_over_and_the_run_trains_what_chunks_train(turns_run, async_run):
    run, _ = turns_run
    assert all(r["staleness/max"] <= 1 for r in run.rows)
    assert run.prompts == async_run.prompts
    assert run.rows[-1]["accounting/trained"] == 8  # the run checked issued = trained + dropped + in flight
    undocumented, missing = schema_gaps({k for r in run.rows for k in r}, {"async", "first_sync", "first_step", "push"})
    assert undocumented == [] and missing == []
