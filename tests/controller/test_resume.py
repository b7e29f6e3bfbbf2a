"""Checkpoint and exact resume: SIGKILL a whole run after step 3, ``run.resume=auto`` continues from its
latest checkpoint (step 2's, or 4's on a fast box) with the same data order and no prompt trained twice
(compared with an uninterrupted run)."""

from __future__ import annotations

import json

import pytest

from tests.controller.resume_helpers import (STEPS, command, kill_after_step, killed_at, prompt_log,
                                             run_to_end)

pytestmark = pytest.mark.slow


def test_sigkill_then_resume_auto_keeps_the_data_order(tiny_llama, tmp_path):
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    run_to_end(command(tiny_llama, reference))
    kill_after_step(command(tiny_llama, crashed), crashed, step=3)
    (run,) = crashed.glob("grpo_tiny-*")
    name = killed_at(run)
    resumed = run_to_end(command(tiny_llama, crashed, "run.resume=auto"))
    assert "resumed" in resumed.stdout and name in resumed.stdout
    expected, got = prompt_log(reference), prompt_log(crashed)
    assert got == expected and len(got) == STEPS
    flat = [p for ids in got for p in ids]
    assert len(flat) == len(set(flat))                       # no prompt trained twice
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["accounting/issued"] == rows[-1]["accounting/trained"] + rows[-1]["accounting/dropped"]
