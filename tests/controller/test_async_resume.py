"""Async-mode resume (k = 1): SIGKILL a whole run after step 3, ``run.resume=auto`` continues from its
latest checkpoint (step 2's, or 4's on a fast box) and trains exactly the prompts an uninterrupted async
run trains, step by step.

What makes it exact: the checkpoint holds the policy's state (sampler cursor, the chunks generated ahead
but not yet trained are generated again), and completions are seeded per (seed, prompt id, sample index),
so the resumed run need not reproduce the engine's random state."""

from __future__ import annotations

import json

import pytest

from tests.controller.resume_helpers import crash_and_resume

pytestmark = pytest.mark.slow
ASYNC = ("mode=async", "buffer.max_staleness=1")


def test_async_sigkill_then_resume_auto_trains_what_an_uninterrupted_run_trains(tiny_llama, tmp_path):
    run, rows = crash_and_resume(tiny_llama, tmp_path, *ASYNC)
    assert all(r["rollout/min_version"] >= r["step"] - 2 for r in rows)  # trainer at step-1, k = 1
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
