"""Bad rewards or models stop `train` with one line before Ray or any actor starts."""

from __future__ import annotations

import pytest

from relayrl.config import ConfigError, load_config
from relayrl.controller import driver
from relayrl.controller.driver import train


@pytest.mark.parametrize("override, expected", [
    ("rewards=[{fn: no_such_pkg.rewards:f}]", "rewards: reward 'no_such_pkg.rewards:f': cannot import module"),
    ("rewards=[{fn: relayrl.rewards.builtin:nope}]", "has no attribute 'nope'"),
    ("model.path=/no/such/model", "model.path"),
])
def test_bad_input_fails_before_ray_starts(override, expected, tmp_path, monkeypatch):
    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started before the bad input was reported")

    monkeypatch.setattr(driver, "start_ray", no_ray)
    cfg = load_config("grpo_tiny", [override, f"run.output_dir={tmp_path}"])
    with pytest.raises(ConfigError) as err:
        train(cfg)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not any(tmp_path.iterdir()), "no run directory should be created for a config error"
