"""The ``run`` section: name, steps, seeds, checkpoints, resume."""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.config.base import ConfigError, positive


@dataclass
class RunConfig:
    name: str = "run"
    """Run name; the run directory is ``output_dir/<name>-<timestamp>``."""
    output_dir: str = "runs"
    """Parent of run directories."""
    steps: int = 20
    """Training steps (one batch of prompts each)."""
    prompts_per_step: int = 4
    """Prompts per step; completions per step = prompts_per_step * algorithm.group_size."""
    seed: int = 0
    """Seed for torch and for the completions: each request is seeded from (run.seed, prompt id), so a resumed
    run generates what the uninterrupted one did."""
    save_final: bool = True
    """Write an HF-format checkpoint (safetensors + tokenizer) at the end."""
    ray_address: str | None = None
    """Ray cluster address; None starts a local Ray."""
    checkpoint_every: int = 10
    """Save a resumable checkpoint (trainer shards via DCP + driver state) every N steps; 0: never (a
    trainer-rank death or a crash then restarts from step 0). 10 bounds the work lost to at most 10
    steps (plus the step whose write was in flight) while costing little: with ``checkpoint_async`` a
    save stalls training only for the copy into host memory, and on disk a checkpoint of
    SmolLM2-135M in fp32 with AdamW is ~1.6 GB (weights + two moments), so ``keep_checkpoints=2`` plus
    one being written peaks at ~5 GB; host memory holds one extra staged copy during a write."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept in <run dir>/checkpoints (older ones are deleted once a newer one is
    complete, so a crash during a write still leaves the previous one)."""
    checkpoint_async: bool = True
    """Write the trainer shards in the background (torch DCP ``async_save``): training waits only for
    a staging copy; the checkpoint counts (``COMPLETE``) once the write is on disk. false: every save
    blocks for the whole write. ``timing/checkpoint_stall`` reports what a save cost the loop."""
    resume: str | None = None
    """auto: continue the newest run of this name that has a complete checkpoint (fresh if none); or a
    path to a run dir or checkpoint dir. The resumed run appends to that run directory."""

    def __post_init__(self) -> None:
        positive("run", self, "steps", "prompts_per_step")
        if self.checkpoint_every < 0 or self.keep_checkpoints < 1:
            raise ConfigError(
                "run.checkpoint_every must be >= 0 and run.keep_checkpoints >= 1; "
                "e.g. run.checkpoint_every=10 run.keep_checkpoints=2"
            )
