"""Async-mode resume (k = 1): SIGKILL a whole run after step 3, ``run.resume=auto`` continues from its
latest checkpoint (step 2's, or 4's on a fast box) and trains exactly the prompts an uninterrupted async
run trains, step by step; in chunks, and streaming one group a call (``rollout.stream``: more calls in
flight, each killed with the run and generated again after the resume).

What makes it exact: the checkpoint holds the policy's state (sampler cursor, the chunks generated ahead
but not yet trained are generated again), and completions are seeded per (seed, prompt id, sample index),
so the resumed run need not reproduce the engine's random state. The reference is the session's
uninterrupted async run (``async_run``), in chunks: streaming must train what chunks train."""

from __future__ import annotations

import json

import pytest

from tests.controller.resume_helpers import crash_and_resume
from tests.controller.tiny_run import ASYNC

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stream", [False, True], ids=["chunks", "stream"])
def test_async_sigkill_then_resume_auto_trains_what_an_uninterrupted_run_trains(
    tiny_llama, tmp_path, async_run, stream
):
    extra = (*ASYNC, *(["rollout.stream=true"] if stream else []))
    run, rows = crash_and_resume(tiny_llama, tmp_path, *extra, expected=async_run.prompts)
    assert all(r["rollout/min_version"] >= r["step"] - 2 for r in rows)  # trainer at step-1, k = 1
    assert all(r["rollout/calls"] == (2 if stream else 1) for r in rows)  # B = 2 groups: 2 calls or 1 chunk
    assert json.loads((run / "status.json").read_text())["status"] == "finished"
