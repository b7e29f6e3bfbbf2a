import io
import json
import math

import pytest
import torch
from rich.console import Console

from relayrl.config import LoggingConfig
from relayrl.monitor.metrics import (
    ConsoleSink,
    JsonlSink,
    MetricsLogger,
    NoopSink,
    WandbSink,
    _clock,
    is_kl_key,
    make_logger,
)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_sink_writes_one_strict_json_object_per_step(tmp_path):
    logger = MetricsLogger([JsonlSink(tmp_path)])
    logger.log(1, {"reward/mean": 0.25, "train/approx_kl": torch.tensor(0.5), "bad": math.nan})
    logger.log(2, {"reward/mean": 0.75})
    logger.log_samples(2, [{"prompt": "p", "completion": "Answer: 3", "reward": 1.0, "prompt_id": 4}])
    logger.close()
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["reward/mean"] == 0.25 and records[0]["train/approx_kl"] == 0.5
    assert records[0]["bad"] is None  # NaN -> null: strict JSON
    assert records[0]["wall_time"] <= records[1]["wall_time"] and records[1]["wall_time"] > 1.6e9
    assert set(records[1]) == {"step", "wall_time", "reward/mean"}
    assert read_jsonl(tmp_path / "samples.jsonl") == [
        {"step": 2, "prompt": "p", "completion": "Answer: 3", "reward": 1.0, "prompt_id": 4}
    ]
    assert logger.history("reward/mean") == [0.25, 0.75]


def test_jsonl_sink_appends_on_resume(tmp_path):
    for step in (1, 2):
        sink = JsonlSink(tmp_path)
        sink.log(step, {"x": step})
        sink.close()
    assert [r["x"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


def test_console_line_has_progress_reward_kl_time_and_eta():
    out = io.StringIO()
    sink = ConsoleSink(total_steps=10, console=Console(file=out, width=200, color_system=None))
    sink.log(
        1,
        {
            "reward/mean": 0.5,
            "reward/std": 0.25,
            "reward/pass_rate": 0.375,
            "train/approx_kl": 0.00123,
            "timing/step": 4.0,
        },
    )
    sink.log(2, {"reward/mean": 0.625, "timing/step": 8.0, "policy/skipped_groups": 0.0})
    sink.log(3, {"reward/mean": 0.0, "timing/step": 0.0, "policy/skipped_groups": 4.0})
    lines = out.getvalue().splitlines()
    assert lines[0] == "step 1/10 | reward 0.500 ±0.250 | pass 0.38 | kl 1.23e-03 | 4.0 s/step | ETA 0:36"
    assert lines[1] == "step 2/10 | reward 0.625 | 8.0 s/step | ETA 0:48"  # mean 6 s x 8 steps left
    assert lines[2] == "step 3/10 | reward 0.000 | skipped 4 flat groups | 0.0 s/step | ETA 0:28"


def test_console_prefers_reference_kl_and_shows_staleness():
    out = io.StringIO()
    sink = ConsoleSink(total_steps=4, console=Console(file=out, width=200, color_system=None))
    assert sink.progress is None  # not a terminal: plain lines only
    sink.log(
        1,
        {
            "reward/mean": 0.25,
            "policy/behaviour_kl": 0.5,
            "policy/approx_kl": 0.002,
            "policy/kl": 0.125,
            "staleness/max": 1.0,
            "timing/step": 3.0,
        },
    )
    assert out.getvalue() == "step 1/4 | reward 0.250 | kl 1.25e-01 | stale 1 | 3.0 s/step | ETA 0:09\n"


def test_console_draws_a_progress_bar_on_a_terminal():
    out = io.StringIO()
    console = Console(file=out, width=160, force_terminal=True, color_system=None)
    sink = ConsoleSink(total_steps=10, console=console)
    assert sink.progress is not None
    sink.log(3, {"reward/mean": 0.625, "staleness/max": 1.0, "timing/step": 5.0})
    sink.close()
    text = out.getvalue()
    assert "step 3/10 | reward 0.625 | stale 1 | 5.0 s/step | ETA 0:35" in text  # the line is kept
    bar = [ln for ln in text.replace("\r", "\n").splitlines() if "train" in ln][-1]
    assert "3/10" in bar and "reward 0.625" in bar and "stale 1" in bar and "ETA 0:35" in bar and "━" in bar


def test_clock_and_kl_names():
    assert [_clock(s) for s in (0, 75, 3725)] == ["0:00", "1:15", "1:02:05"]
    assert [is_kl_key(k) for k in ("train/kl", "train/approx_kl", "kl_ref", "reward/mean", "skl_x")] == [
        True,
        True,
        True,
        False,
        False,
    ]


def test_logger_fans_out_and_closes_once():
    class Recorder(NoopSink):
        def __init__(self):
            self.calls = []

        def log(self, step, metrics):
            self.calls.append(("log", step, metrics))

        def log_samples(self, step, rows):
            self.calls.append(("samples", step, rows))

        def close(self):
            self.calls.append(("close",))

    a, b = Recorder(), Recorder()
    with MetricsLogger([a, b]) as logger:
        logger.log(3, {"loss": torch.tensor(2.0)})
        logger.log_samples(3, [{"x": 1}])
        logger.close()
    assert a.calls == b.calls == [("log", 3, {"loss": 2.0}), ("samples", 3, [{"x": 1}]), ("close",)]
    assert type(a.calls[0][2]["loss"]) is float


def test_make_logger_picks_sinks(tmp_path):
    logger = make_logger(LoggingConfig(wandb="disabled", console=False), tmp_path, {}, 5)
    assert [type(s) for s in logger.sinks] == [JsonlSink]
    logger.close()
    logger = make_logger(LoggingConfig(wandb="disabled", console=True), tmp_path, {}, 5)
    assert [type(s) for s in logger.sinks] == [JsonlSink, ConsoleSink]
    logger.close()


def test_wandb_sink_mode_is_passed_through(tmp_path, monkeypatch):
    import wandb

    seen = {}
    monkeypatch.setattr(wandb, "init", lambda **kw: seen.update(kw) or object())
    WandbSink(tmp_path / "r", "proj", "online", {"a": 1}).ready()
    assert (seen["mode"], seen["dir"], seen["project"], seen["config"]) == (
        "online",
        str(tmp_path / "r"),
        "proj",
        {"a": 1},
    )
    with pytest.raises(ValueError, match=r"logging\.wandb=disabled"):
        WandbSink(tmp_path, "proj", "disabled")


def test_wandb_start_error_surfaces_at_ready(tmp_path, monkeypatch):
    """wandb starts on a helper thread; its error must reach the driver (which calls ready() before any actor
    starts), not vanish on that thread."""
    import wandb

    def refuse(**kw):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", refuse)
    logger = MetricsLogger([WandbSink(tmp_path / "r", "proj", "online")])
    with pytest.raises(wandb.errors.UsageError, match="api_key"):
        logger.ready()
    logger.close()  # the driver's finally: must not raise the start-up error a second time


def test_console_skips_step_0_the_initial_models_eval():
    """eval.before_first_step logs eval/* as step 0: no training step, so no line and no share of the ETA."""
    out = io.StringIO()
    sink = ConsoleSink(total_steps=4, console=Console(file=out, width=200, color_system=None))
    sink.log(0, {"eval/greedy_accuracy": 0.5, "eval/time_s": 30.0})
    sink.log(1, {"reward/mean": 0.25, "timing/step": 3.0})
    assert out.getvalue() == "step 1/4 | reward 0.250 | 3.0 s/step | ETA 0:09\n"  # 3 s x 3 steps left
