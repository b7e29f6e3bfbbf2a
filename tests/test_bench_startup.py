"""bench/startup_floor.py's bare trainer batch, by hand-worked numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.startup_floor import batch


def test_batch_pads_right_scores_completion_tokens_and_normalises_rewards_per_group():
    rows = [
        {"prompt_ids": [5, 6], "completion_ids": [[7], [8, 9]], "rewards": [1.0, 0.0]},
        {"prompt_ids": [4], "completion_ids": [[3, 2], [1]], "rewards": [0.5, 0.5]},
    ]
    ids, mask, scored, adv = batch(rows)
    assert ids.tolist() == [[5, 6, 7, 0], [5, 6, 8, 9], [4, 3, 2, 0], [4, 1, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]
    # scored[i, j]: ids[i, j + 1] is a completion token (position j predicts it)
    assert scored.tolist() == [[0, 1, 0], [0, 1, 1], [1, 1, 0], [1, 0, 0]]
    # group 1: mean 0.5, std (unbiased) sqrt(0.5) -> +-0.7071; group 2 agrees: 0
    assert adv.tolist() == pytest.approx([0.5 / 0.5**0.5, -0.5 / 0.5**0.5, 0.0, 0.0], rel=1e-5)


def test_cpu_roles_from_process_names():
    from bench.startup_floor import role_of

    assert role_of("ray::TrainerActor.setup") == "trainer"
    assert role_of("ray::RewardWorker") == "reward pool"
    assert role_of("VLLM::Worker") == "engine"
    assert role_of("python -B -c from multiprocessing.forkserver import main; main(5, 7)") == "engine"
    assert role_of("ray::IDLE") == "Ray system"
    assert role_of("/x/raylet --raylet_socket_name=/tmp/ray/s") == "Ray system"
    assert role_of("python -m relayrl.cli train --config-name grpo_arith") == "driver"
    assert role_of("python -m bench.startup_floor --child trainer /tmp/w 1.0") == "trainer"
    assert role_of("wandb-core") == "other"


def test_cpu_times_parsed_from_proc_text():
    from bench.startup_floor import TICK, box_busy_s, proc_times

    # user nice system idle iowait irq softirq steal: busy = user + nice + system + irq + softirq
    assert box_busy_s("cpu  100 20 30 999 50 4 6 2 0 0") == pytest.approx(160 / TICK)
    # a name with spaces and parentheses; utime 7, stime 5 (fields 14, 15), start 12345 (field 22)
    stat = "42 (ray::a (b) c) S 1 42 42 0 -1 0 0 0 0 0 7 5 0 0 20 0 1 0 12345 100 10"
    assert proc_times(stat) == (pytest.approx(12 / TICK), 12345)


def test_cpu_until_counts_each_process_once_at_its_last_sample_under_its_last_name():
    from bench.startup_floor import Sample, cpu_until

    samples = [
        Sample(10.0, 500.0, {1: ("python -m relayrl.cli train", 0.5)}),
        Sample(10.5, 501.0, {1: ("python -m relayrl.cli train", 1.0), 2: ("ray::IDLE", 0.3)}),
        # pid 2 became the trainer; pid 3 ended before this sample (kept at its last one)
        Sample(11.0, 502.5, {1: ("python -m relayrl.cli train", 1.2), 2: ("ray::TrainerActor", 0.9)}),
        Sample(11.5, 504.0, {1: ("python -m relayrl.cli train", 1.6), 2: ("ray::TrainerActor", 1.9)}),
    ]
    samples[1].procs[3] = ("VLLM::Worker", 0.4)
    got = cpu_until(samples, at=10.9)  # the first sample at or after 10.9 is the one at 11.0
    assert got["busy CPU-s"] == pytest.approx(2.5)
    assert (got["driver"], got["trainer"], got["engine"]) == (
        pytest.approx(1.2),
        pytest.approx(0.9),
        pytest.approx(0.4),
    )
    assert got["Ray system"] == 0.0 and got["other"] == 0.0


def test_cpu_meter_counts_only_what_started_after_it_and_an_exiting_process_keeps_its_name():
    import subprocess
    import sys
    import time

    from bench.startup_floor import CpuMeter

    meter = CpuMeter(period_s=0.05)
    meter.start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)  # cpu-meter-probe"])
    try:
        deadline = time.time() + 60
        while not any(child.pid in s.procs for s in meter.samples) and time.time() < deadline:
            time.sleep(0.05)
        meter.stop()
        (name,) = {s.procs[child.pid][0] for s in meter.samples if child.pid in s.procs}
        assert "cpu-meter-probe" in name
        assert not any(1 in s.procs for s in meter.samples)  # init started before the meter: not counted
        # exited, not yet reaped: a zombie, whose command line is empty
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.05)
        assert Path(f"/proc/{child.pid}/cmdline").read_text() == ""
        assert meter._name(child.pid) == name
    finally:
        child.kill()
        child.wait()
