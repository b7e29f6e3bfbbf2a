"""The converted SmolLM2 directory, built once per machine (the conversion takes about a minute)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """Converted into the user's model cache (env ``RELAYRL_CACHE`` moves it), so later sessions reuse it."""
    from relayrl.models import resolve_model

    return resolve_model("smollm2")
