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


@pytest.mark.parametrize("make_override, expected", [
    (lambda d, m: [f"model.path={m}", "model.max_model_len=100000"], "exceeds the model's context"),
    (lambda d, m: [f"model.path={m}", "rollout.max_tokens=256"], "leaves no room for the prompt"),
    (lambda d, m: [f"model.path={m}", "data.task=jsonl", f"data.path={d / 'empty.jsonl'}"], "has no rows"),
    (lambda d, m: [f"model.path={m}", "data.task=jsonl", f"data.path={d / 'bad.jsonl'}"], "bad.jsonl:2"),
])
def test_context_and_dataset_are_checked_before_ray(make_override, expected, tmp_path, tiny_llama, monkeypatch):
    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started before the bad input was reported")

    data = tmp_path / "data"
    data.mkdir()
    (data / "empty.jsonl").write_text("")
    (data / "bad.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n{"question": \n')
    monkeypatch.setattr(driver, "start_ray", no_ray)
    cfg = load_config("grpo_tiny", [*make_override(data, tiny_llama), f"run.output_dir={tmp_path / 'runs'}"])
    with pytest.raises(ConfigError) as err:
        train(cfg)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()
