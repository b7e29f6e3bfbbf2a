"""grpo_tiny end to end: real vLLM rollout actor, 2 FSDP2 trainer ranks (gloo), shm weight sync."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from relayrl.config import load_config
from relayrl.controller import train
from relayrl.monitor.schema import schema_gaps


@pytest.fixture(scope="module")
def tiny_run(ray_session, tiny_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    cfg = load_config(
        "grpo_tiny",
        [
            f"model.path={tiny_llama}",
            f"run.output_dir={out}",
            "trainer.world_size=2",
            "trainer.num_cpus=0.5",
            "rollout.num_cpus=0.5",
            "run.steps=3",
            "logging.wandb=offline",
            "weightsync.verify_every=2",
        ],
    )
    return cfg, train(cfg)


def test_parameters_changed_and_checkpoint_loads(tiny_run, tiny_llama):
    _, result = tiny_run
    before = load_file(tiny_llama / "model.safetensors")
    after = load_file(result.checkpoint / "model.safetensors")
    assert before.keys() <= after.keys() | {"lm_head.weight"}
    changed = [k for k in before if k in after and not torch.equal(before[k], after[k])]
    assert len(changed) >= len(before) // 2, f"only {len(changed)} of {len(before)} tensors changed"


def test_metrics_per_step_and_versions_follow_steps(tiny_run):
    cfg, result = tiny_run
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, cfg.run.steps + 1))
    for r in rows:
        assert r["weightsync/version"] == r["step"]
        assert r["weightsync/bytes"] > 0 and r["weightsync/stall_s"] > 0
        assert r["rollout/min_version"] == r["step"] - 1  # sync mode: strictly on-policy
        for key in ("reward/mean", "policy/loss", "policy/grad_norm", "timing/generate", "timing/train", "timing/sync"):
            value = r.get(key)  # a NaN is logged as null, an inf as Infinity
            assert isinstance(value, (int, float)) and math.isfinite(value), (key, value)
    verified = [r for r in rows if "mismatch/mean_abs" in r]
    assert [r["step"] for r in verified] == [2] and verified[0]["mismatch/tokens"] > 0
    assert verified[0]["mismatch/max_abs"] < 1e-3  # the engine runs exactly the trainer's weights
    assert (result.run_dir / "samples.jsonl").exists()
    assert list((result.run_dir / "wandb").glob("offline-run-*")), "wandb offline files missing"


def test_every_schema_metric_is_logged_and_nothing_else(tiny_run):
    """Sync, 2 ranks, verify_every=2: every `always`, `verify` and `first_sync` metric appears at least once,
    and every logged key is documented in relayrl/monitor/schema.py."""
    _, result = tiny_run
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    undocumented, missing = schema_gaps({k for r in rows for k in r}, {"verify", "first_sync", "first_step", "push"})
    assert undocumented == [] and missing == []
    first = rows[0]
    assert not [k for r in rows[1:] for k in r if k.startswith("startup/")], "startup/* only with the first step"
    assert first["startup/engines_up_s"] <= first["startup/actors_s"]  # stages of one clock, in order
    assert first["startup/to_first_step_s"] >= first["startup/actors_s"] + first["startup/first_step_s"]
    assert first["perf/tokens_per_s"] == first["rollout/tokens"] / first["timing/step"]
    assert first["policy/lr"] == 1e-3  # grpo_tiny's trainer.lr
    assert all(r["memory/engine_gb"] > 0 and r["memory/trainer_peak_gb"] > 0 for r in rows)  # read, not 0


def test_run_dir_status_plots_and_wandb_samples_table(tiny_run):
    cfg, result = tiny_run
    assert json.loads((result.run_dir / "status.json").read_text())["status"] == "finished"
    assert sorted(p.name for p in (result.run_dir / "plots").glob("*.png")) == [
        "kl.png",
        "reward.png",
        "staleness.png",
        "throughput.png",
        "timing.png",
    ]
    run = next((result.run_dir / "wandb").glob("offline-run-*"))
    tables = sorted((run / "files" / "media" / "table").glob("samples_*.table.json"))
    assert len(tables) == cfg.run.steps  # one wandb.Table of completions per step
    table = json.loads(tables[0].read_text())
    assert table["columns"][:4] == ["prompt_id", "prompt", "completion", "reward"] and len(table["data"]) == 2


def test_actor_and_engine_output_goes_to_the_run_logs(tiny_run):
    """One file per rollout actor, holding its vLLM engine's lines too (EngineCore is a subprocess that
    inherits the actor's stdout and stderr); the console would have shown them without relayrl.logs."""
    _, result = tiny_run
    rollout = list((result.run_dir / "logs").glob("rollout-*.log"))
    assert len(rollout) == 1
    assert "(EngineCore pid=" in rollout[0].read_text()
