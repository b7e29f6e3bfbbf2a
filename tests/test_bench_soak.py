"""bench/soak.py's slope and verdict, by hand-worked numbers."""

from __future__ import annotations

import math

import pytest

from bench.soak import block_means, fit, kind_of, trend

STEPS = [0, 100, 200, 300]


def test_slope_and_its_standard_error():
    # x - mean x = -150, -50, 50, 150: Sxx = 50000. y = 0, 1, 3, 2: y - mean y = -1.5, -0.5, 1.5, 0.5
    # slope = (225 + 25 + 75 + 75) / 50000 = 0.008; fitted 0.3, 1.1, 1.9, 2.7; residuals -0.3, -0.1, 1.1, -0.7
    # sum of squares 1.8, over n - 2 = 2: 0.9; se = sqrt(0.9 / 50000) = 0.0042426
    slope, se = fit(STEPS, [0, 1, 3, 2])
    assert slope == pytest.approx(0.008)
    assert se == pytest.approx(math.sqrt(0.9 / 50000))


def test_a_rise_the_scatter_explains_is_flat_and_one_it_cannot_grows():
    # as above, per 100 steps: 0.8 +- 0.424; 0.8 < 3 x 0.424: flat
    noisy = trend(STEPS, [0, 1, 3, 2], lo=0, hi=400, blocks=4)
    assert (noisy.slope, noisy.se, noisy.verdict) == (pytest.approx(0.8), pytest.approx(0.42426, abs=1e-5), "flat")
    assert noisy.change == pytest.approx(0.008 * 400)
    # y = 0, 1, 2, 3.1: slope 515 / 50000 = 0.0103; residuals 0.02, -0.01, -0.04, 0.03 (sum of squares 0.003);
    # se = sqrt(0.0015 / 50000) = 1.732e-4: 1.03 +- 0.0173 per 100 steps, 59 standard errors: grows
    steady = trend(STEPS, [0, 1, 2, 3.1], lo=0, hi=400, blocks=4)
    assert (steady.slope, steady.se, steady.verdict) == (pytest.approx(1.03), pytest.approx(0.01732, abs=1e-5), "grows")
    assert trend(STEPS, [3.1, 2, 1, 0], lo=0, hi=400, blocks=4).verdict == "shrinks"
    assert trend(STEPS, [7, 7, 7, 7], lo=0, hi=400, blocks=4).verdict == "flat"  # slope 0, se 0


def test_blocks_average_the_samples_of_equal_spans_of_the_window():
    # window [100, 300) in 2 blocks of 100 steps: 100, 150 | 200, 250, 299; 50 and 300 fall outside
    steps = [50, 100, 150, 200, 250, 299, 300]
    values = [9, 1, 3, 4, 5, 6, 9]
    assert block_means(steps, values, lo=100, hi=300, blocks=2) == ([125, 249.66666666666666], [2, 5])
    assert trend(steps, values, lo=100, hi=300, blocks=2).verdict == "too few samples"


def test_process_kinds_from_command_lines():
    server = "python -B -c from multiprocessing.forkserver import main; main(5, 7)"
    assert kind_of("python -m relayrl.cli train", "bash", is_driver=True) == "driver"
    assert kind_of(server, "python -m relayrl.cli train", is_driver=False) == "fork server"
    assert kind_of(server, server, is_driver=False) == "engine host"  # forked from the server, never exec'd
    assert kind_of("VLLM::Worker", server, is_driver=False) == "engine worker"
    assert kind_of("ray::RolloutActor.generate", "raylet", is_driver=False) == "rollout actor"
    assert kind_of("python -B -c from multiprocessing.resource_tracker import main;main(4)", server, False) == (
        "resource tracker"
    )
