"""The reward section of the config: defaults, ranges, and reward kwargs from a recipe."""

import pytest

from relayrl.config import ConfigError, load_config
from relayrl.preflight import resolve_rewards
from relayrl.rewards.builtin import CodeExec


def test_defaults_and_overrides():
    cfg = load_config("grpo_tiny", ["reward.timeout_s=5", "reward.num_workers=3"])
    assert (cfg.reward.timeout_s, cfg.reward.num_workers, cfg.reward.max_error_rate, cfg.reward.groups_per_call) == (
        5.0,
        3,
        0.25,
        1,
    )


@pytest.mark.parametrize(
    "override, message",
    [
        ("reward.max_error_rate=1.5", "reward.max_error_rate=1.5 must be in [0, 1]"),
        ("reward.timeout_s=0", "reward.timeout_s=0.0 must be > 0"),
        ("reward.num_workers=0", "reward.num_workers=0 must be > 0"),
        ("reward.timeoutt=3", "unknown config key 'reward.timeoutt'; did you mean 'reward.timeout_s'?"),
    ],
)
def test_bad_values_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config("grpo_tiny", [override])


def test_recipe_kwargs_reach_the_function():
    cfg = load_config("grpo_tiny", ["rewards=[{fn: regex_match, weight: 0.5, kwargs: {pattern: 'a+'}}]"])
    [(name, fn, weight)] = resolve_rewards(cfg, None)
    assert (name, weight) == ("regex_match", 0.5) and fn([""] * 2, ["aaa", "ab"]) == [1.0, 0.0]


def test_sandbox_mode_is_checked_at_load(monkeypatch):
    from relayrl.rewards import sandbox

    assert load_config("grpo_tiny", []).reward.sandbox == "auto"
    with pytest.raises(ConfigError, match=r"^reward.sandbox='off' is not supported; use one of auto, rlimits$"):
        load_config("grpo_tiny", ["reward.sandbox=off"])
    monkeypatch.setattr(sandbox, "namespaces_available", lambda: False)
    assert load_config("grpo_tiny", []).reward.sandbox == "auto"  # no code_exec: nothing to isolate
    cfg = load_config("grpo_tiny", ["rewards=[{fn: code_exec, weight: 1.0}]"])
    with pytest.raises(ConfigError, match=r"^rewards: reward.sandbox=auto needs full isolation for code_exec"):
        resolve_rewards(cfg, None)
    ((_, fn, _),) = resolve_rewards(
        load_config("grpo_tiny", ["rewards=[{fn: code_exec, weight: 1.0}]", "reward.sandbox=rlimits"]), None
    )
    assert getattr(fn, "level") == 1  # noqa: B009 - fn is typed as a plain callable


def test_reward_sandbox_reaches_code_exec_unless_its_kwargs_say(monkeypatch):
    from relayrl.rewards import load_reward_fns, sandbox

    monkeypatch.setattr(sandbox, "namespaces_available", lambda: True)  # wiring only: no probe

    [(name, fn, _), (_, own, _)] = load_reward_fns(
        [("code_exec", 1.0), ("code_exec", 1.0, {"sandbox": "auto"})], sandbox="rlimits"
    )
    assert isinstance(fn, CodeExec) and isinstance(own, CodeExec)
    assert (name, fn.sandbox, fn.metrics(), own.sandbox) == (
        "code_exec",
        "rlimits",
        {"reward/sandbox_isolation": 1.0},
        "auto",
    )
