"""DAPO's dynamic sampling end to end: groups without reward spread are dropped and the step is refilled
with more prompts until it has run.prompts_per_step groups that vary (async k=1, real vLLM + trainer)."""

from __future__ import annotations

import json

from relayrl.config import load_config
from relayrl.controller import train


def test_steps_are_refilled_to_full_batches_within_the_staleness_bound(ray_session, tiny_llama, tmp_path):
    steps, B = 3, 2
    cfg = load_config(
        "dapo_tiny",
        [
            f"model.path={tiny_llama}",
            f"run.output_dir={tmp_path}",
            f"run.steps={steps}",
            f"run.prompts_per_step={B}",
            "mode=async",
            "buffer.max_staleness=1",
            "rewards=[{fn: tests.controller.dapo_rewards:half_flat}]",
            "trainer.num_cpus=0.5",
            "rollout.num_cpus=0.5",
        ],
    )
    result = train(cfg)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["dapo/kept_groups"] >= B  # every step trained a full batch of varied groups
        assert r["dapo/kept_groups"] + r["dapo/dropped_groups"] == r["dapo/drawn_groups"]
        assert r["staleness/max"] <= 1
    assert sum(r["dapo/drawn_groups"] for r in rows) > steps * B  # flat groups made it draw more prompts
    last = rows[-1]
    assert last["accounting/trained"] == sum(r["dapo/drawn_groups"] for r in rows)
