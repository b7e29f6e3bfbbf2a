"""Async-mode resume (k = 1): SIGKILL a whole run after step 3, ``run.resume=auto`` continues from the
step-2 checkpoint and trains exactly the prompts an uninterrupted async run trains, step by step.

What makes it exact: the checkpoint holds the policy's state (sampler cursor, the chunks generated ahead
but not yet trained are generated again), and completions are seeded per (seed, prompt id, sample index),
so the resumed run need not reproduce the engine's random state."""

from __future__ import annotations

import json

import pytest

from tests.controller.resume_helpers import (STEPS, command, kill_after_step, killed_at, prompt_log,
                                             run_to_end)

pytestmark = pytest.mark.slow
ASYNC = ("mode=async", "buffer.max_staleness=1")


def test_async_sigkill_then_resume_auto_trains_what_an_uninterrupted_run_trains(tiny_llama, tmp_path):
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    run_to_end(command(tiny_llama, reference, *ASYNC))
    kill_after_step(command(tiny_llama, crashed, *ASYNC), crashed, step=3)
    (run,) = crashed.glob("grpo_tiny-*")
    name = killed_at(run)
    resumed = run_to_end(command(tiny_llama, crashed, *ASYNC, "run.resume=auto"))
    assert "resumed" in resumed.stdout and name in resumed.stdout
    expected, got = prompt_log(reference), prompt_log(crashed)
    assert got == expected and len(got) == STEPS
    flat = [p for ids in got for p in ids]
    assert len(flat) == len(set(flat))                       # no prompt trained twice
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["rollout/min_version"] >= r["step"] - 2 for r in rows)   # trainer at step-1, k = 1
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
