"""A run with nothing to learn spends nothing on learning and says so: a reward that never varies leaves every
group flat, so each step drops all its groups (``policy/skipped_groups``), runs no forward or backward
(no ``policy/loss``, 0 sequences) and the console gets the no-signal warning once."""

from __future__ import annotations

import json

from relayrl.config import load_config
from relayrl.controller import train

STEPS, PROMPTS = 4, 2


def never_right(prompts: list[str], completions: list[str], **_) -> list[float]:
    """A task the model never solves: every completion scores 0."""
    return [0.0] * len(completions)


def test_flat_run_skips_every_update_and_warns_once(ray_session, tiny_llama, tmp_path, capfd):
    cfg = load_config(
        "grpo_tiny",
        [
            f"model.path={tiny_llama}",
            f"run.output_dir={tmp_path}",
            f"run.steps={STEPS}",
            f"run.prompts_per_step={PROMPTS}",
            "run.save_final=false",
            "logging.no_signal_steps=2",
        ],
    )
    result = train(cfg, rewards=[never_right])
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert r["reward/zero_std_groups"] == 1.0 and r["policy/skipped_groups"] == PROMPTS
        assert r["policy/sequences"] == 0 and "policy/loss" not in r and "policy/grad_norm" not in r
    err = capfd.readouterr().err
    assert err.count("no learning signal") == 1, err[-2000:]
    assert "for 2 steps in a row" in err
