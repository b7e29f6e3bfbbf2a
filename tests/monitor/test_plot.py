import json
import math

import pytest

from relayrl.monitor.metrics import JsonlSink, MetricsLogger
from relayrl.monitor.plot import SPARK_CHARS, _downsample, plot_run, reward_curve_ascii

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir, steps: int = 20):
    """A synthetic async run in schema names: reward climbs, KL grows, one step in three trains on data
    one version old, throughput dips when it does."""
    logger = MetricsLogger([JsonlSink(run_dir)])
    for step in range(1, steps + 1):
        correct = min(1.0, step / steps + 0.05 * math.sin(step))
        stale = 2.0 if step % 3 == 0 else 0.0
        logger.log(
            step,
            {
                "reward/mean": correct + 0.1,
                "reward/std": 0.3 * (1 - correct),
                "reward/arith_correct": correct,
                "reward/answer_format": 1.0,
                "reward/pass_rate": correct,
                "reward/errors": 0.0,
                "reward/error_rate": 0.0,
                "reward/errors/timeout": 0.0,
                "reward/zero_std_groups": 0.5,
                "policy/approx_kl": 1e-3 * step,
                "policy/kl": 5e-4 * step,
                "staleness/0": 4.0 - stale,
                "staleness/1": stale,
                "staleness/max": float(stale > 0),
                "perf/tokens_per_s": 200.0 - 30 * (stale > 0),
                "perf/tokens_per_s_per_replica": 100.0,
                "rollout/tokens_per_s": 400.0,
                "perf/completions_per_s": 8.0 - stale,
                "timing/step": 2.0,
                "timing/generate": 1.2,
                "timing/reward": 0.1,
                "timing/train": 0.5,
                "timing/sync": 0.1,
                "timing/wait": 0.05,
            },
        )
    logger.close()


def test_plot_run_writes_every_chart(tmp_path):
    write_run(tmp_path)
    paths = plot_run(tmp_path)
    assert [p.name for p in paths] == ["reward.png", "kl.png", "staleness.png", "throughput.png", "timing.png"]
    for p in paths:
        assert p.parent == tmp_path / "plots" and p.read_bytes()[:8] == PNG_MAGIC
        assert p.stat().st_size > 10_000  # a real chart, not an empty canvas
    from matplotlib.image import imread

    assert imread(paths[0]).shape[:2] == (400, 700)  # figsize 7x4 at 100 dpi


def test_reward_chart_draws_functions_not_error_counts(tmp_path, monkeypatch):
    import relayrl.monitor.plot as plot

    write_run(tmp_path, steps=5)
    drawn = {}

    def record(path, title, ylabel, lines, band=None):
        drawn[path.name] = [label for label, _, _ in lines]
        return path

    monkeypatch.setattr(plot, "_save_chart", record)
    plot_run(tmp_path)
    assert drawn["reward.png"] == ["reward (weighted total)", "arith_correct", "answer_format"]
    assert drawn["kl.png"] == ["policy/approx_kl", "policy/kl"]


def test_cli_plot_prints_the_paths(tmp_path, capsys):
    from relayrl.cli import main

    write_run(tmp_path, steps=3)
    assert main(["plot", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == [
        str(tmp_path / "plots" / n) for n in ("reward.png", "kl.png", "staleness.png", "throughput.png", "timing.png")
    ]


def test_plot_skips_charts_without_data_and_tolerates_nulls(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"step": 1, "reward/mean": None},
                {"step": 2, "reward/mean": 0.5},
                {"step": 3, "reward/mean": 0.75},
            ]
        )
    )
    assert [p.name for p in plot_run(tmp_path)] == ["reward.png"]


def test_plot_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"metrics\.jsonl does not exist; pass a run directory"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="has no steps yet"):
        plot_run(tmp_path)


def test_reward_curve_ascii_scales_between_min_and_max():
    line = reward_curve_ascii([0.0, 0.5, 1.0, float("nan"), 0.25])
    assert line == "reward 0.000 ▁▅█▃ 0.250 (min 0.000, max 1.000, 4 steps)"
    # (0.5 - 0) / 1 * 7 = 3.5 -> round half to even = 4 -> '▅'; 0.25 * 7 = 1.75 -> 2 -> '▃'
    assert reward_curve_ascii([0.3, 0.3]).split()[2] == SPARK_CHARS[3] * 2  # flat: middle height
    assert reward_curve_ascii([]) == "reward (no finite values)"
    assert len(reward_curve_ascii(list(range(500)), width=40).split()[2]) == 40


def test_downsample_means_by_hand():
    assert _downsample([1, 2, 3, 4, 5, 6], 3) == [1.5, 3.5, 5.5]
    assert _downsample([1, 2, 3, 4, 5], 2) == [1.5, 4.0]  # edges 0, round(2.5)=2, 5: [1,2] [3,4,5]
    assert _downsample([1, 2], 5) == [1, 2]


def test_eval_chart_when_the_run_evaluated_during_training(tmp_path, monkeypatch):
    """eval.every: a step-0 line (the initial model) and eval/* on some steps -> eval.png with every eval
    figure but its seconds, each line at the steps that have it (step 0 included)."""
    import relayrl.monitor.plot as plot

    write_run(tmp_path, steps=4)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    evals = {0: 0.25, 2: 0.5, 4: 0.75}
    records = [{"step": 0, "wall_time": 0.0}] + [json.loads(x) for x in lines]
    for r in records:
        if r["step"] in evals:
            r.update(
                {
                    "eval/greedy_accuracy": evals[r["step"]],
                    "eval/sampled_accuracy": 0.3,
                    "eval/pass@4": 0.6,
                    "eval/mean_reward": 0.4,
                    "eval/time_s": 3.0,
                }
            )
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert [p.name for p in plot_run(tmp_path)] == [
        "reward.png",
        "kl.png",
        "staleness.png",
        "throughput.png",
        "timing.png",
        "eval.png",
    ]
    assert (tmp_path / "plots" / "eval.png").read_bytes()[:8] == PNG_MAGIC
    drawn = {}

    def record(path, title, ylabel, lines, band=None):
        drawn[path.name] = lines
        return path

    monkeypatch.setattr(plot, "_save_chart", record)
    plot_run(tmp_path)
    assert drawn["eval.png"][0] == ("eval/greedy_accuracy", [0, 2, 4], [0.25, 0.5, 0.75])
    assert [label for label, _, _ in drawn["eval.png"]] == [
        "eval/greedy_accuracy",
        "eval/sampled_accuracy",
        "eval/pass@4",
        "eval/mean_reward",
    ]
