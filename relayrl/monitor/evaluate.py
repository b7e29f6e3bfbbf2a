"""``relayrl eval``: score a checkpoint or HF model on a dataset with vLLM - accuracy and pass@k.

    prompts (cfg.data, chat template as in training) --> RolloutActor (vLLM, n samples each)
        --> reward functions (cfg.rewards, in this process) --> pass per completion --> accuracy, pass@k

A completion *passes* when its primary reward function (the first in ``cfg.rewards``) gives >= 1, the
rule behind ``reward/pass_rate`` in training; a completion a reward function failed on counts as not
passing. accuracy = passing completions / all completions (= mean pass@1); pass@k per prompt is the
unbiased estimator of ``monitor.passk``, averaged over prompts.

Generation goes through the same ``RolloutActor`` (and engine arguments) as training, so an eval of
``checkpoints/final`` samples exactly as the last training step did, unless ``temperature`` overrides.
Reward functions run in this process without the training pool's timeouts.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayrl.config import Config, ConfigError
from relayrl.monitor.passk import mean_pass_at_k


@dataclass
class EvalResult:
    model: str
    prompts: int
    samples_per_prompt: int
    accuracy: float                      # passing completions / all completions
    pass_at_k: dict[int, float]          # k -> mean pass@k over prompts
    mean_reward: float                   # mean weighted total reward over scored completions
    rows: list[dict[str, Any]]           # one per completion: prompt_id, sample, completion, rewards, passed

    def summary(self) -> str:
        passed = sum(r["passed"] for r in self.rows)
        ks = " | ".join(f"pass@{k} {v:.3f}" for k, v in sorted(self.pass_at_k.items()))
        return (f"accuracy {self.accuracy:.3f} ({passed}/{len(self.rows)}) | {ks} | mean reward "
                f"{self.mean_reward:.3f} | {self.prompts} prompts x {self.samples_per_prompt} samples")


def run_config(run_dir: str | Path, overrides: list[str] = ()) -> Config:
    """The resolved ``config.yaml`` of a run directory, with ``key=value`` overrides, validated."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from relayrl.config import validate

    path = Path(run_dir) / "config.yaml"
    try:
        saved = OmegaConf.load(path)
        saved.pop("defaults", None)
        merged = OmegaConf.merge(OmegaConf.structured(Config), saved, OmegaConf.from_dotlist(list(overrides)))
        return validate(OmegaConf.to_object(merged))
    except (OSError, OmegaConfBaseException) as exc:
        raise ConfigError(f"{path}: {str(exc).splitlines()[0]}; pass --config-name to use a recipe instead") from None


def find_run_dir(model: str | Path) -> Path | None:
    """The run directory a checkpoint lies in (``<run>/checkpoints/<name>``), or ``model`` itself if it is one."""
    for candidate in (Path(model), *list(Path(model).parents)[:2]):
        if (candidate / "config.yaml").is_file() and (candidate / "metrics.jsonl").exists():
            return candidate
    return None


def evaluate(cfg: Config, model: str | Path | None = None, n: int = 1, ks: tuple[int, ...] = (1,),
             limit: int | None = None, temperature: float | None = None,
             out_dir: str | Path | None = None) -> EvalResult:
    """Sample ``n`` completions for each of the first ``limit`` prompts of ``cfg.data`` with ``model``
    (default ``cfg.model.path``), score them with ``cfg.rewards``; write completions.jsonl and
    summary.json into ``out_dir`` when given."""
    from relayrl.controller.driver import resolve_model_path, resolve_rewards

    bad_k = [k for k in ks if not 1 <= k <= n]
    if bad_k:
        raise ConfigError(f"pass@k needs 1 <= k <= n; got k={bad_k} with n={n}; raise -n or lower -k")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(model or cfg.model.path)))
    model_path = resolve_model_path(cfg)
    reward_fns = resolve_rewards(cfg, None)
    prompts = eval_prompts(cfg, model_path, limit)
    groups = generate(cfg, model_path, prompts, n, temperature)
    rows = score(groups, reward_fns)
    result = summarize(str(model_path), rows, n, ks)
    if out_dir is not None:
        write_result(result, Path(out_dir))
    return result


def eval_prompts(cfg: Config, model_path: Path, limit: int | None) -> list[dict[str, Any]]:
    """``{"prompt_id", "prompt", "columns"}`` for the first ``limit`` rows, formatted as in training."""
    from transformers import AutoTokenizer

    from relayrl.data import chat_formatter, load_task

    rows = load_task(cfg.data)[:limit]
    if not rows:
        raise ConfigError(f"data.task={cfg.data.task} gave no prompts; check data.path or --limit")
    fmt = chat_formatter(AutoTokenizer.from_pretrained(model_path), cfg.data.chat_template)
    return [{"prompt_id": i, "prompt": fmt(row["question"]), "columns": row} for i, row in enumerate(rows)]


def generate(cfg: Config, model_path: Path, prompts: list[dict[str, Any]], n: int,
             temperature: float | None) -> list[Any]:
    """``n`` completions per prompt from one rollout actor (Ray is started if it is not running)."""
    import ray

    from relayrl.controller.cluster import start_ray
    from relayrl.rollout import start_rollout_actor

    rollout_cfg = cfg.rollout if temperature is None else dataclasses.replace(cfg.rollout, temperature=temperature)
    start_ray(cfg.run.ray_address, cfg.placement, rollout_cfg.num_cpus)
    actor = start_rollout_actor(str(model_path), cfg.model, rollout_cfg, cfg.run.seed)
    try:
        return ray.get(actor.generate.remote(prompts, n))
    finally:
        try:
            ray.get(actor.shutdown.remote(), timeout=30)
        finally:
            ray.kill(actor)


def score(groups: list[Any], reward_fns: list[tuple]) -> list[dict[str, Any]]:
    """Fill every trajectory's rewards (in place) and return one row per completion with ``passed``."""
    from relayrl.rewards.scoring import fill_rewards, flatten, plan_calls, run_local, unique_names

    fns = unique_names(reward_fns)
    calls = plan_calls(groups, len(fns), 1)
    fill_rewards(groups, fns, calls, run_local(fns, flatten(groups), calls))
    primary = fns[0][0]
    return [{"prompt_id": g.prompt_id, "sample": t.sample_idx, "prompt": g.prompt, "completion": t.completion_text,
             "reward": t.reward if t.excluded is None else None, "rewards": dict(t.rewards),
             "excluded": None if t.excluded is None else t.excluded.reason,
             "passed": t.excluded is None and (t.rewards.get(primary) or 0.0) >= 1.0}
            for g in groups for t in g.trajectories]


def summarize(model: str, rows: list[dict[str, Any]], n: int, ks: tuple[int, ...]) -> EvalResult:
    """accuracy, pass@k and the mean reward from per-completion rows (``n`` per prompt)."""
    counts: dict[int, int] = {}
    for r in rows:
        counts[r["prompt_id"]] = counts.get(r["prompt_id"], 0) + int(r["passed"])
    scored = [r["reward"] for r in rows if r["reward"] is not None]
    return EvalResult(model, len(counts), n, sum(r["passed"] for r in rows) / len(rows),
                      {k: mean_pass_at_k(list(counts.values()), n, k) for k in ks},
                      sum(scored) / len(scored) if scored else float("nan"), rows)


def write_result(result: EvalResult, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "completions.jsonl").open("w", encoding="utf-8") as f:
        for row in result.rows:
            f.write(json.dumps(row) + "\n")
    summary = {k: v for k, v in dataclasses.asdict(result).items() if k != "rows"}
    (out_dir / "summary.json").write_text(json.dumps({**summary, "time": time.time()}, indent=1) + "\n")
