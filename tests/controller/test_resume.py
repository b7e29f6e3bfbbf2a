"""Checkpoint and exact resume: SIGKILL a whole run after step 3, ``run.resume=auto`` continues from its
latest checkpoint (step 2's, or 4's on a fast box) with the same data order and no prompt trained twice
(compared with an uninterrupted run)."""

from __future__ import annotations

import pytest

from tests.controller.resume_helpers import crash_and_resume

pytestmark = pytest.mark.slow


def test_sigkill_then_resume_auto_keeps_the_data_order(tiny_llama, tmp_path):
    _, rows = crash_and_resume(tiny_llama, tmp_path)
    assert rows[-1]["accounting/issued"] == rows[-1]["accounting/trained"] + rows[-1]["accounting/dropped"]
