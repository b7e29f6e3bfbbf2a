"""The actors of one run and the fan-out calls the loop makes on them (refs in, refs out)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from relayrl.config import Config
from relayrl.controller.cluster import Placement

RewardFns = list[tuple[str, Callable, float]]


@ray.remote(num_cpus=0.1)
def score_task(reward_fns: RewardFns, samples_per_step: int, *replica_groups: list) -> tuple:
    """Score every completion of the step in one pass (reward fns see the whole batch).

    Returns one scored group list per replica, then a small metric dict (with a few sample rows).
    """
    from relayrl.rewards.scoring import reward_metrics, score_groups

    flat = [g for groups in replica_groups for g in groups]
    score_groups(flat, reward_fns)
    metrics = {**reward_metrics(flat), **rollout_metrics(flat)}
    metrics["_samples"] = sample_rows(flat, samples_per_step)
    return (*replica_groups, metrics)


def rollout_metrics(groups: list) -> dict[str, float]:
    """Lengths, truncation and the policy versions that produced this step's tokens."""
    trajs = [t for g in groups for t in g.trajectories]
    lengths = [len(t.completion_token_ids) for t in trajs]
    return {"rollout/completions": float(len(trajs)), "rollout/tokens": float(sum(lengths)),
            "rollout/len_mean": sum(lengths) / max(len(lengths), 1),
            "rollout/truncated_frac": sum(t.finish_reason == "length" for t in trajs) / max(len(trajs), 1),
            "rollout/min_version": float(min(g.min_version for g in groups)),
            "rollout/max_version": float(max(t.versions[-1].version for t in trajs if t.versions))}


def sample_rows(groups: list, k: int) -> list[dict]:
    """The first completion of the first ``k`` groups, for samples.jsonl / the wandb table."""
    return [{"prompt_id": g.prompt_id, "prompt": g.prompt, "completion": g.trajectories[0].completion_text,
             "reward": g.trajectories[0].reward, **{f"col/{k}": str(v) for k, v in g.columns.items()}}
            for g in groups[:k]]


@dataclass
class System:
    cfg: Config
    sampler: Any
    rollouts: list[Any]
    trainer: Any
    reward_fns: RewardFns

    @classmethod
    def start(cls, cfg: Config, model_path: Path, placement: Placement, reward_fns: RewardFns,
              run: Any) -> "System":
        """Create the sampler, N rollout actors and the trainer group; wait until all are ready."""
        from relayrl.rollout import start_rollout_actor
        from relayrl.trainer.group import TrainerGroup

        sampler = make_sampler(cfg, model_path)
        rollouts = [start_rollout_actor(str(model_path), cfg.model, cfg.rollout, cfg.run.seed + i,
                                        sync_cfg=cfg.weightsync, **opts)
                    for i, opts in enumerate(placement.rollout)]
        trainer = TrainerGroup(cfg.trainer.world_size, str(model_path), cfg.model, cfg.trainer, cfg.algorithm,
                               temperature=cfg.rollout.temperature, seed=cfg.run.seed,
                               actor_options=placement.trainer)
        ray.get([r.weight_version.remote() for r in rollouts])  # engines are up
        trainer.ready()
        return cls(cfg, sampler, rollouts, trainer, reward_fns)

    def generate(self, prompts: list[dict]) -> list[ray.ObjectRef]:
        """Spread prompts round-robin over replicas; one ref of list[TrajectoryGroup] per replica."""
        n = len(self.rollouts)
        chunks = [prompts[i::n] for i in range(n)]
        refs = [r.generate.remote(c, self.cfg.algorithm.group_size) for r, c in zip(self.rollouts, chunks)]
        ray.wait(refs, num_returns=len(refs), fetch_local=False)
        return refs

    def score(self, group_refs: list[ray.ObjectRef]) -> tuple[list[ray.ObjectRef], dict]:
        out = score_task.options(num_returns=len(group_refs) + 1).remote(
            self.reward_fns, self.cfg.logging.samples_per_step, *group_refs)
        out = out if isinstance(out, list) else [out]
        return out[:-1], ray.get(out[-1])

    def sync_weights(self, version: int) -> dict[str, float]:
        """Trainer publishes weights (gathered from FSDP shards); every engine loads them at ``version``."""
        t0 = time.perf_counter()
        handle = self.trainer.publish_weights(self.cfg.weightsync, version)
        t1 = time.perf_counter()
        ray.get([r.update_weights.remote(handle, version) for r in self.rollouts])
        t2 = time.perf_counter()
        versions = ray.get([r.weight_version.remote() for r in self.rollouts])
        return {"weightsync/bytes": float(handle.nbytes), "weightsync/publish_s": t1 - t0,
                "weightsync/load_s": t2 - t1, "weightsync/version": float(version),
                "weightsync/engine_versions_ok": float(versions == [version] * len(versions))}

    def shutdown(self) -> None:
        for r in self.rollouts:
            try:
                ray.get(r.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - best effort; the actor is killed next anyway
                pass
            ray.kill(r)
        self.trainer.shutdown()


def make_sampler(cfg: Config, model_path: Path):
    """Prompts from the configured task, formatted with the model's chat template."""
    from transformers import AutoTokenizer

    from relayrl.data import load_task
    from relayrl.data.sampler import PromptSampler, chat_formatter

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows = load_task(cfg.data)
    return PromptSampler(rows, cfg.run.prompts_per_step, cfg.data.seed,
                         chat_formatter(tokenizer, cfg.data.chat_template))
