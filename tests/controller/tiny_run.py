"""In-process grpo_tiny runs (this test process is the Ray driver) and what they left in their run directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from relayrl.config import Config, load_config
from relayrl.controller import train

ASYNC = ("mode=async", "buffer.max_staleness=1")


@dataclass
class TinyRun:
    cfg: Config
    path: Path  # the run directory
    rows: list[dict]  # metrics.jsonl, one row a step

    @property
    def prompts(self) -> list[list[int]]:
        """prompts.jsonl: the prompt ids each step trained, in order."""
        lines = (self.path / "prompts.jsonl").read_text().splitlines()
        return [json.loads(line)["prompt_ids"] for line in lines]


def train_tiny(tiny_llama: Path, out: Path, overrides: list[str]) -> TinyRun:
    """grpo_tiny for 4 steps (unless ``overrides`` say otherwise) on the session's Ray."""
    cfg = load_config(
        "grpo_tiny",
        [
            f"model.path={tiny_llama}",
            f"run.output_dir={out}",
            "run.steps=4",
            "rollout.num_cpus=0.5",
            "trainer.num_cpus=0.5",
            *overrides,
        ],
    )
    path = train(cfg).run_dir
    return TinyRun(cfg, path, [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()])
