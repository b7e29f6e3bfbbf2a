"""The statistics the reward scorer adds to each scored call: completion lengths, truncation, empty completions,
the versions that sampled the tokens, tool use, and a few sample rows (``System.score`` hands ``step_summary`` to
the scorer, which runs it beside the rewards)."""

from __future__ import annotations

from relayrl.monitor.schema import (
    ROLLOUT_COMPLETIONS,
    ROLLOUT_MAX_VERSION,
    ROLLOUT_MIN_VERSION,
    ROLLOUT_TOKENS,
)
from relayrl.rewards.scoring import version_span


def step_summary(samples_per_step: int, groups: list) -> dict:
    """What the reward scorer adds to its metrics each step: rollout statistics and a few sample rows."""
    return {**rollout_metrics(groups), "_samples": sample_rows(groups, samples_per_step)}


def rollout_metrics(groups: list) -> dict[str, float]:
    """Lengths, truncation, empty completions (no visible text: EOS first or whitespace; they are trained
    on like any other, so a rising share means the policy learned to say nothing) and the policy versions
    that produced this step's tokens."""
    trajs = [t for g in groups for t in g.trajectories]
    lengths = [len(t.completion_token_ids) for t in trajs]
    n = max(len(trajs), 1)
    low, high = version_span(groups)
    return {
        ROLLOUT_COMPLETIONS: float(len(trajs)),
        ROLLOUT_TOKENS: float(sum(lengths)),
        "rollout/len_mean": sum(lengths) / n,
        "rollout/truncated_frac": sum(t.finish_reason == "length" for t in trajs) / n,
        "rollout/empty_frac": sum(not t.completion_text.strip() for t in trajs) / n,
        ROLLOUT_MIN_VERSION: float(low),
        ROLLOUT_MAX_VERSION: float(high),
        **env_metrics(trajs),
    }


def env_metrics(trajs: list) -> dict[str, float]:
    """Tool use and turns of the step's episodes (``Trajectory.env_metrics``); nothing for single-turn runs."""
    episodes = [t.env_metrics for t in trajs if t.env_metrics]
    if not episodes:
        return {}
    n = len(episodes)
    out = {f"env/{k}": sum(e.get(k, 0.0) for e in episodes) / n for k in ("turns", "tool_calls", "tool_errors")}
    out["env/tool_call_rate"] = sum(e.get("tool_calls", 0.0) > 0 for e in episodes) / n
    out["env/timeout_frac"] = sum(e.get("timed_out", 0.0) for e in episodes) / n
    return out


def sample_rows(groups: list, k: int) -> list[dict]:
    """The first completion of the first ``k`` groups, for samples.jsonl / the wandb table."""
    return [
        {
            "prompt_id": g.prompt_id,
            "prompt": g.prompt,
            "completion": g.trajectories[0].completion_text,
            "reward": g.trajectories[0].reward,
            **{f"col/{k}": str(v) for k, v in g.columns.items()},
        }
        for g in groups[:k]
    ]
