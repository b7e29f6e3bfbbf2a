"""Runs more than one module checks: built once a session, on first use."""

from __future__ import annotations

import pytest

from tests.controller.tiny_run import ASYNC, TinyRun, train_tiny


@pytest.fixture(scope="session")
def async_run(ray_session, tiny_llama, tmp_path_factory) -> TinyRun:
    """An uninterrupted grpo_tiny run, mode=async with k = 1, 4 steps, in chunks: ``test_async`` checks it;
    ``test_stream`` and ``test_async_resume`` compare the prompts their runs train with the ones it trained
    (the same seeded sampler, in start order: which prompts a step trains depends on neither streaming, nor
    faults, nor resumes)."""
    return train_tiny(tiny_llama, tmp_path_factory.mktemp("async"), list(ASYNC))
