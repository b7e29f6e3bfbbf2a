"""Two real vLLM replicas, async k=1: prompts are spread over both, every sync reaches both engines,
and the accounting holds. The loop runs in the test (``System`` + ``Scheduler``, as ``driver.run_once``
does) so that the engines can be asked their weight version before they shut down."""

from __future__ import annotations

import json

import pytest
import ray

from relayrl.config import load_config
from relayrl.controller.cluster import make_placement
from relayrl.controller.run import RunDir
from relayrl.controller.scheduler import Scheduler
from relayrl.controller.system import System
from relayrl.preflight import resolve_model_path, resolve_rewards

pytestmark = pytest.mark.slow  # ~3.5 min on a loaded 2-core CPU box
STEPS = 3


def test_two_replicas_both_generate_and_both_get_every_sync(ray_session, tiny_llama, tmp_path):
    cfg = load_config(
        "grpo_tiny",
        [
            f"model.path={tiny_llama}",
            f"run.output_dir={tmp_path}",
            f"run.steps={STEPS}",
            "rollout.num_replicas=2",
            "run.prompts_per_step=2",
            "mode=async",
            "buffer.max_staleness=1",
            "rollout.num_cpus=0.5",
            "trainer.num_cpus=0.5",
            "logging.wandb=disabled",
            "run.save_final=false",
        ],
    )
    run = RunDir.create(cfg)
    placement = make_placement(cfg.rollout, cfg.trainer, cfg.placement)
    system = System.start(cfg, resolve_model_path(cfg), placement, resolve_rewards(cfg, None), run)
    try:
        scheduler = Scheduler(cfg, system, run)
        scheduler.run_steps()
        versions = ray.get([r.weight_version.remote() for r in system.rollouts])
    finally:
        system.shutdown()
        run.logger.close()
        ray.util.remove_placement_group(placement.group)
    assert scheduler.policy.version == STEPS
    assert versions == [STEPS, STEPS]  # the last sync reached both engines
    calls = scheduler.calls  # generate calls scored per replica id
    assert len(calls) == 2 and min(calls.values()) >= 1 and sum(calls.values()) >= 2 * STEPS, calls  # both generated
    rows = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["weightsync/version"] == r["step"] and r["staleness/max"] <= 1 for r in rows)
    c = scheduler.policy.counts
    assert c["trained"] == STEPS * 2 and c["issued"] == c["trained"] + c["dropped"] + scheduler.policy.in_flight()
