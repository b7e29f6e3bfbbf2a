"""The recipe's ``reward.sandbox`` reaches the rewards that run programs (``code_exec``)."""

from __future__ import annotations

import pytest

from relayrl.config import load_config
from relayrl.preflight import resolve_rewards

CODE = "rewards=[{fn: code_exec, weight: 1.0}]"


@pytest.mark.parametrize("mode, level", [("rlimits", 1), ("auto", 2)])
def test_reward_sandbox_setting_reaches_code_exec(mode, level, monkeypatch):
    from relayrl.rewards import sandbox
    from relayrl.rewards.builtin import CodeExec

    monkeypatch.setattr(sandbox, "namespaces_available", lambda: True)  # wiring only: no probe
    cfg = load_config("grpo_tiny", [CODE, f"reward.sandbox={mode}"])
    ((_, fn, _),) = resolve_rewards(cfg, None)
    assert isinstance(fn, CodeExec) and fn.level == level
