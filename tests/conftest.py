"""Session-wide fixtures: tiny models built once, one local Ray per test session."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests on boxes without CUDA."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_llama(model_cache) -> Path:
    from relayrl.models.tiny import build_tiny_model

    return build_tiny_model("tiny-llama", model_cache / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_qwen2(model_cache) -> Path:
    from relayrl.models.tiny import build_tiny_model

    return build_tiny_model("tiny-qwen2", model_cache / "tiny-qwen2")


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session (starting Ray costs seconds)."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
        )
    yield ray
    ray.shutdown()


@pytest.fixture
def console():
    """relayrl's log lines on the console, as the CLI and ``relayrl.train`` show them (pytest captures them
    for ``capsys``). The handler goes again after the test unless an earlier one had installed it."""
    from relayrl import logs

    log = logging.getLogger("relayrl")
    had = any(isinstance(h, logs.ConsoleHandler) for h in log.handlers)
    handler = logs.show_on_console()
    yield handler
    if not had:
        log.removeHandler(handler)
