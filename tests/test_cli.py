"""``python -m relayrl`` is the ``relayrl`` command: same help, same config, same exit codes."""

import subprocess
import sys
from pathlib import Path

import yaml


def _module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "relayrl", *args],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )


def test_python_m_prints_the_composed_config():
    done = _module("train", "--config-name", "grpo_tiny", "--print-config", "run.steps=3", "algorithm.whiten=sequence")
    assert done.returncode == 0, done.stderr
    cfg = yaml.safe_load(done.stdout)
    assert (cfg["run"]["steps"], cfg["algorithm"]["whiten"], cfg["eval"]["num_prompts"]) == (3, "sequence", 64)


def test_python_m_help_matches_the_console_script():
    script = Path(sys.executable).with_name("relayrl")
    done = _module("--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: relayrl ")
    if script.exists():  # installed entry point: byte-for-byte the same help
        assert subprocess.run([script, "--help"], capture_output=True, text=True).stdout == done.stdout


def test_python_m_exits_2_with_one_line_on_a_bad_key():
    done = _module("train", "--config-name", "grpo_tiny", "--print-config", "trainer.lrr=1")
    assert done.returncode == 2
    assert done.stderr.strip() == "relayrl: config error: unknown config key 'trainer.lrr'; did you mean 'trainer.lr'?"
