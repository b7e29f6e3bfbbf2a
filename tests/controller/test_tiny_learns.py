"""PPO (with its critic) and GRPO each raise the reward on the tiny task end to end: real vLLM rollout, one
FSDP2 trainer rank, shm weight sync, 20 steps of ``ppo_tiny`` / ``grpo_tiny`` on the digit-fraction reward (a
random tiny model writes few digits; the share of digits is something it can learn in a few steps).
PPO's value loss must fall as well: its critic starts at V = 0 and learns the returns."""

from __future__ import annotations

import json

import pytest

from relayrl.config import load_config
from relayrl.controller import train

STEPS = 30


def _run(recipe: str, tiny_llama, tmp_path):
    cfg = load_config(
        recipe,
        [
            f"model.path={tiny_llama}",
            f"run.output_dir={tmp_path}",
            f"run.steps={STEPS}",
            "run.prompts_per_step=4",
            "run.save_final=false",
            "logging.wandb=disabled",
            "logging.console=false",
        ],
    )
    result = train(cfg)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    first, last = result.window_means(5)
    print(f"{recipe}: reward first-5 mean {first:.3f} -> last-5 mean {last:.3f}")
    return first, last, rows


def _series(rows: list[dict], name: str) -> list[float]:
    """A trainer stat per step, under its schema name (``policy/<name>``) or as the trainer returned it."""
    key = f"policy/{name}"
    return [r[key] if key in r else r[name] for r in rows]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


@pytest.mark.slow
def test_grpo_tiny_raises_reward(ray_session, tiny_llama, tmp_path):
    first, last, _ = _run("grpo_tiny", tiny_llama, tmp_path)
    assert last - first >= 0.1


@pytest.mark.slow
def test_ppo_tiny_raises_reward_and_lowers_value_loss(ray_session, tiny_llama, tmp_path):
    first, last, rows = _run("ppo_tiny", tiny_llama, tmp_path)
    value_loss, ev = _series(rows, "value_loss"), _series(rows, "explained_variance")
    print(
        f"ppo_tiny: value loss first-5 {_mean(value_loss[:5]):.4f} -> last-5 {_mean(value_loss[-5:]):.4f}; "
        f"explained variance first-5 {_mean(ev[:5]):.3f} -> last-5 {_mean(ev[-5:]):.3f}"
    )
    assert last - first >= 0.1
    assert _mean(value_loss[-5:]) < 0.5 * _mean(value_loss[:5])
